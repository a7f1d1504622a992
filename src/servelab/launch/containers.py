"""docker and podman containers by name, as the server's launch and the GPU host-speed canary
handle them: whether one exists, and removing one, checked gone (a container outlives the
engine's client that started it: a job killed outright leaves it running)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from servelab.env.container import ContainerRun

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
# how long a stopped server's container is removed for, and the pause between tries
REMOVE_WITHIN_S = 60.0
REMOVE_RETRY_S = 0.5


def engine_call(run: Runner, cmd: list[str] | None, timeout_s: float = 60.0) -> str | None:
    """Run an engine command; its output, None when it fails (a container already gone is
    fine)."""
    if cmd is None:
        return None
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(proc.stdout) if proc.returncode == 0 else None


def container_exists(container: ContainerRun, run: Runner = subprocess.run) -> bool:
    """Whether a container of this name exists, running or not (never for apptainer)."""
    cmd = container.exists_command()
    return cmd is not None and engine_call(run, cmd, 20) is not None


def remove_container(container: ContainerRun, run: Runner = subprocess.run) -> bool:
    """Remove a docker or podman container by name, checked gone (True) and tried again until
    REMOVE_WITHIN_S: an `rm --force` that meets `run --rm`'s own removal under way can fail and
    leave it. One still there then is said on stderr, with the command that removes it."""
    deadline = time.monotonic() + REMOVE_WITHIN_S
    while True:
        engine_call(run, container.remove_command(), REMOVE_WITHIN_S)
        if not container_exists(container, run):
            return True
        if time.monotonic() >= deadline:
            break
        time.sleep(REMOVE_RETRY_S)
    rm = " ".join(container.remove_command() or [])
    print(f"servelab: container {container.name} is still there: `{rm}`", file=sys.stderr)
    return False
