"""Nsight Systems for the profiling pass: the host's install (`find_host_nsys`: profile.nsys,
then `nsys` on PATH, then the usual install folders, newest version first), and, for a
container whose image holds none, whether the host's runs inside the image once mounted there
(`nsys_in_image`), found out in the runtime stage, before any server starts.

A venv runtime runs the host's nsys directly; a container gets the host's install folder
mounted read-only (servelab.env.container.nsys_mount) into the profiling launch.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NotRequired, TypedDict

from servelab.documents.declared import HostNsysJson, NsysInImage, RuntimeJson
from servelab.env.container import ContainerRun, nsys_mount
from servelab.env.runtime.tools import HostTools, Runner, call, last_line
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection, RuntimeSection

# The usual install folders, after profile.nsys and PATH: NVIDIA's devtools packages
# (nsight-systems-cli-<version>, nsight-systems-<version>) and the CUDA toolkit's copy.
NSYS_GLOBS: tuple[str, ...] = (
    "/opt/nvidia/nsight-systems-cli/*/target-linux-*/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-*/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
)
_NSYS_VERSION_RE = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*)")
# Folders an nsys may lie in without being an install folder of its own (not mounted).
_SYSTEM_DIRS = {"/", "/usr", "/usr/local", "/usr/lib", "/usr/lib64", "/opt", "/opt/nvidia"}


def parse_nsys_version(text: str | None) -> str | None:
    """`nsys --version` ("NVIDIA Nsight Systems version 2025.5.1.121-255136380782v0") ->
    "2025.5.1.121"; None when it says no version."""
    m = _NSYS_VERSION_RE.search(text or "")
    return m.group(1) if m else None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path))


def nsys_install_dir(executable: str) -> str | None:
    """The install folder of an nsys (symlinks resolved): the folder above its bin/ or
    target-linux-*/ folder; None when it lies in a system folder such as /usr/bin."""
    real = Path(executable).resolve()
    parent = real.parent
    root = parent.parent if parent.name == "bin" or parent.name.startswith("target-") else parent
    return None if str(root) in _SYSTEM_DIRS else str(root)


def nsys_candidates(
    configured: str,
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NSYS_GLOBS,
) -> list[tuple[str, str]]:
    """(path, how it was found) of every nsys on this host, in the order tried: profile.nsys
    (a path, or a name on PATH), `nsys` on PATH, then each install-folder pattern, newest
    version first. Nothing is run."""
    found: list[tuple[str, str]] = []
    if "/" in configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            found.append((configured, "profile.nsys"))
    elif (hit := which(configured)) is not None:
        found.append((hit, "profile.nsys on PATH"))
    if (hit := which("nsys")) is not None:
        found.append((hit, "PATH"))
    for pattern in globs:
        hits = [h for h in glob.glob(pattern) if os.path.isfile(h) and os.access(h, os.X_OK)]
        found += [(h, "install folder") for h in sorted(hits, key=_version_key, reverse=True)]
    seen: set[str] = set()
    out = []
    for path, how in found:
        real = str(Path(path).resolve())
        if real not in seen:
            seen.add(real)
            out.append((path, how))
    return out


class HostNsysRecord(TypedDict):
    """The host's Nsight Systems in runtime.json: found (host_nsys) or why not
    (host_nsys_reason), and for an image that holds none whether it runs there."""

    host_nsys: HostNsysJson | None
    host_nsys_reason: str | None
    host_nsys_in_image: NotRequired[NsysInImage]


class NsysFields(TypedDict, total=False):
    """The host's Nsight Systems in runtime.json (HostNsysRecord),
    looked for where the image holds none."""

    host_nsys: HostNsysJson | None
    host_nsys_reason: str | None
    host_nsys_in_image: NsysInImage


def add_nsys_fields(record: RuntimeJson, nsys: NsysFields) -> None:
    """Put the host's Nsight Systems fields into a runtime record (none where not looked for)."""
    if "host_nsys" in nsys:
        record["host_nsys"] = nsys["host_nsys"]
    if "host_nsys_reason" in nsys:
        record["host_nsys_reason"] = nsys["host_nsys_reason"]
    if "host_nsys_in_image" in nsys:
        record["host_nsys_in_image"] = nsys["host_nsys_in_image"]


@dataclass(frozen=True)
class HostNsys:
    """An Nsight Systems found on this host, and that answered `nsys --version`."""

    path: str
    found_by: str  # profile.nsys, profile.nsys on PATH, PATH, install folder
    version: str | None  # parsed, e.g. 2025.5.1.121
    version_text: str  # the line it printed
    install_dir: str | None  # what a container mounts (None: not mountable)

    def to_json(self) -> HostNsysJson:
        return {
            "path": self.path,
            "found_by": self.found_by,
            "version": self.version,
            "version_text": self.version_text,
            "install_dir": self.install_dir,
        }


def find_host_nsys(
    configured: str,
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NSYS_GLOBS,
    run: Runner | None = None,
) -> HostNsys | str:
    """The first nsys on this host (nsys_candidates' order) that answers `nsys --version`, or
    the reason there is none (one line)."""
    runner: Runner = run or subprocess.run
    failed: list[str] = []
    for path, how in nsys_candidates(configured, which, globs):
        try:
            proc = runner(
                [path, "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            failed.append(f"{path}: {exc}")
            continue
        text = (proc.stdout or "").strip().splitlines()
        if proc.returncode != 0 or not text:
            failed.append(f"{path} --version: exit {proc.returncode}")
            continue
        return HostNsys(path, how, parse_nsys_version(text[-1]), text[-1], nsys_install_dir(path))
    if failed:
        return f"no nsys on this host answers --version ({'; '.join(failed)[:300]})"
    return f"nsys ({configured}) not found on this host (PATH, {', '.join(globs) or 'no folders'})"


def wants_nsys(runtime: RuntimeSection, profile: ProfileSection) -> bool:
    """Whether the profiling pass may run Nsight Systems (a GPU, tool nsys or auto)."""
    return profile.enabled and profile.tool in ("nsys", "auto") and runtime.device == "gpu"


def globs_of(tools: HostTools) -> tuple[str, ...]:
    """The install-folder patterns tools look in (NSYS_GLOBS unless it names others)."""
    return NSYS_GLOBS if tools.nsys_globs is None else tuple(tools.nsys_globs)


def host_nsys_record(
    profile: ProfileSection, tools: HostTools, say: Callable[[str], None]
) -> HostNsysRecord:
    """runtime.json's host_nsys (what find_host_nsys found) or host_nsys_reason."""
    host = find_host_nsys(profile.nsys, tools.which, globs_of(tools), tools.run)
    if isinstance(host, str):
        say(f"runtime: {host}")
        return {"host_nsys": None, "host_nsys_reason": host}
    say(f"runtime: nsys {host.version or '?'} on this host: {host.path} ({host.found_by})")
    return {"host_nsys": host.to_json(), "host_nsys_reason": None}


# An engine's own exit statuses for a command it could not start (docker run's reference:
# 125 the daemon failed, 126 the command cannot be invoked, 127 it cannot be found).
_NOT_STARTED = (125, 126, 127)
STATUS_LINES = 40  # of `nsys status --environment`, kept in runtime.json


def _ran(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return ((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()


def nsys_in_image(base: ContainerRun, host: HostNsys, run: Runner) -> NsysInImage:
    """Run the host's Nsight Systems inside the image, mounted as the profiling pass mounts
    it: `nsys --version`, then `nsys status --environment` (no GPU). runtime.json's
    host_nsys_in_image: runs (both answered: a version line; the status run started and said
    something), what each printed, and otherwise the reason (one line)."""
    assert host.install_dir is not None
    mount, inside = nsys_mount(host.install_dir, str(Path(host.path).resolve()))
    probe = replace(
        base, name=f"servelab-nsys-check-{os.getpid()}", gpus=None, mounts=(*base.mounts, mount)
    )
    out: NsysInImage = {
        "runs": False,
        "executable": inside,
        "mount": mount.spec(),
        "version_text": None,
        "status_exit": None,
        "status": [],
        "reason": None,
    }
    what = f"the host's Nsight Systems {host.path} does not run in {base.image}"
    try:
        version = call(run, probe.run_command([inside, "--version"], "", 0), 300)
        lines = _ran(version)
        if version.returncode != 0 or parse_nsys_version(lines[-1] if lines else "") is None:
            out["reason"] = f"{what} (nsys --version: {last_line(version)})"
            return out
        out["version_text"] = lines[-1]
        status = call(run, probe.run_command([inside, "status", "--environment"], "", 0), 300)
    except ServelabError as exc:
        out["reason"] = f"{what} ({exc})"
        return out
    out["status_exit"] = status.returncode
    out["status"] = [line.rstrip() for line in _ran(status)][:STATUS_LINES]
    if status.returncode in _NOT_STARTED or not out["status"]:
        out["reason"] = f"{what} (nsys status --environment: {last_line(status)})"
        return out
    out["runs"] = True
    return out
