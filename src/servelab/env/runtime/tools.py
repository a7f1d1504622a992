"""How the runtime stage reaches this host: the commands it runs, the executables it looks
for, NVML. Tests hand in fakes through `HostTools`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servelab.errors import ServelabError

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class HostTools:
    """What the runtime stage uses to look at this host.

    which: finds an executable on PATH (the engine, nsys); nsys_globs: the install-folder
    patterns find_host_nsys tries (None: servelab.env.runtime.nsys.NSYS_GLOBS); run: runs a
    command, as subprocess.run; nvml: the pynvml module (None: imported when needed)."""

    which: Callable[[str], str | None] = shutil.which
    nsys_globs: Sequence[str] | None = None
    run: Runner = subprocess.run
    nvml: Any = None


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line a command printed (stderr first), for a one-line message."""
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1][:300] if lines else f"exit {proc.returncode}"


def call(
    run: Runner,
    cmd: list[str],
    timeout: float | None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run cmd and capture what it prints; raises a one-line error when it cannot be run or
    does not end within timeout seconds. env: the whole environment (None: this process's)."""
    extra: dict[str, dict[str, str]] = {} if env is None else {"env": dict(env)}
    try:
        return run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **extra)
    except subprocess.TimeoutExpired:
        raise ServelabError(f"{' '.join(cmd[:3])} ...: no answer after {timeout:g} s") from None
    except OSError as exc:
        raise ServelabError(f"{cmd[0]}: cannot run it: {exc}") from None
