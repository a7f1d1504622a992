"""Which server configurations the profiling pass captures, and with which tool.

`profile_plan` decides before anything starts (the workflow reads it to plan the jobs) and
raises when profile.required is true and profiling cannot happen; `for_runtime` revises a
decision at capture time with the Nsight Systems there is: the image's (runtime.json "nsys"),
else the host's (servelab.env.runtime.find_host_nsys), which a container gets mounted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.documents.declared import HostNsysJson, NsysUseJson
from servelab.env.container import ENGINES, Mount, nsys_mount
from servelab.env.runtime import NSYS_GLOBS, HostNsys, nsys_candidates
from servelab.errors import ServelabError
from servelab.experiment import Experiment, ProfileSection

TOOLS = ("auto", "torch", "nsys", "none")


@dataclass(frozen=True)
class NsysUse:
    """The Nsight Systems a capture runs."""

    executable: str  # as the launch runs it (in a container: the path inside)
    source: str  # image | host
    version: str | None = None
    mount: Mount | None = None  # in a container: the host's install folder, read-only
    host: HostNsysJson | None = None  # HostNsys.to_json() when it is the host's

    def to_json(self) -> NsysUseJson:
        return {
            "executable": self.executable,
            "source": self.source,
            "version": self.version,
            "mount": self.mount.spec() if self.mount else None,
            "host": {**self.host} if self.host is not None else None,
        }


@dataclass(frozen=True)
class Decision:
    tool: str | None  # torch | nsys | None (not profiled)
    reason: str | None = None
    note: str | None = None
    nsys: NsysUse | None = None  # for nsys, once for_runtime has found it


def profiled_configs(exp: Experiment) -> list[str]:
    """Server configurations that get a profile job (in server.configs order)."""
    names = exp.server.names
    wanted = exp.profile.server_configs
    if wanted is None:
        return names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ServelabError(
            f"profile.server_configs: {unknown[0]!r} is not in server.configs "
            f"({', '.join(names)}); list names from server.configs, or null for all"
        )
    return [n for n in names if n in wanted]


def profile_plan(
    exp: Experiment,
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NSYS_GLOBS,
) -> dict[str, Decision]:
    """What each profiled configuration will get; raises before anything starts when
    profiling is required and cannot happen. Nothing is run: nsys is looked for on this host
    (profile.nsys, PATH, the install folders `globs`); in a container the runtime stage and
    the capture job look (the image's, else the host's), and for_runtime() revises this."""
    p = exp.profile
    device = exp.runtime.device
    tool = p.tool
    nsys_found = exp.runtime.kind in ENGINES or bool(nsys_candidates(p.nsys, which, globs))
    missing = f"nsys ({p.nsys}) not found on PATH or in the usual install folders"
    decision: Decision
    if not p.enabled:
        decision = Decision(None, "profile.enabled is false")
    elif tool == "none":
        decision = Decision(None, "profile.tool is none")
    elif tool == "nsys" and device != "gpu":
        decision = Decision(None, "profile.tool nsys needs runtime.device gpu")
    elif tool == "nsys" and not nsys_found:
        decision = Decision(None, missing)
    elif tool == "auto" and device == "gpu":
        decision = (
            Decision("nsys")
            if nsys_found
            else Decision("torch", note=f"{missing}; vLLM's torch profiler used")
        )
    elif tool == "auto":
        decision = Decision("torch")
    else:
        decision = Decision(tool)
    if p.required and decision.tool is None and p.enabled:
        raise ServelabError(
            f"profile.required is true but {decision.reason}; install Nsight Systems (nsys) "
            "or set profile.required: false"
        )
    return {sc: decision for sc in profiled_configs(exp)}


def on_sweep_launch(exp: Experiment, plan: Mapping[str, Decision] | None = None) -> list[str]:
    """The profiled configurations whose diagnostic points run on the sweep's own launch
    (profile.launch, docs/profile.md "Which launch"), in server.configs order: the sweep's
    server is started with the profiler configured and left idle until its last point is
    measured, and the job that measures the sweep captures the profile too. `auto` picks it
    for vLLM's torch profiler on a CPU runtime with a fixed number of repeats, where a paired
    test found that a launch with the profiler configured and idle measures the same
    (benchmarks/README.md, "The profiling pass on the sweep's launch"); never under nsys, which
    instruments the server process, nor on a GPU, where that was not measured, nor with a
    sequential plan: its last round is known only at the look after it, which reads every
    configuration's round, and by then each of the round's launches has stopped (one measuring
    server per host), so there is no last launch left to profile on (docs/profile.md). Raises
    (one line) for `sweep` where it cannot apply."""
    p = exp.profile
    decisions = profile_plan(exp) if plan is None else plan
    if p.launch == "own":
        return []
    sequential = exp.sweep.rounds is not None
    out = []
    for sc, decision in decisions.items():
        if decision.tool is None:
            continue  # not profiled: a record of its own, no server
        if p.launch == "sweep":
            if decision.tool != "torch":
                raise ServelabError(
                    f"profile.launch: sweep needs vLLM's torch profiler, but {sc!r} is "
                    f"profiled with {decision.tool} (it instruments the server process: the "
                    "capture needs a launch of its own); set profile.launch: own or auto"
                )
            if sequential:
                raise ServelabError(
                    "profile.launch: sweep does not go with a sequential plan (sweep.repeats "
                    "{min, max}): its last round is known only after that round's launches "
                    "have stopped; set profile.launch: own or auto"
                )
            out.append(sc)
        elif decision.tool == "torch" and exp.runtime.device == "cpu" and not sequential:
            out.append(sc)
    return out


def for_runtime(
    decision: Decision,
    profile: ProfileSection,
    runtime: Mapping[str, object],
    host: Callable[[], HostNsys | str],
) -> Decision:
    """The plan's decision, with the Nsight Systems it runs: in a container the image's
    (runtime.json "nsys") when it has one, else the host's install folder mounted in; on a
    venv the host's. host() looks for the host's (servelab.env.runtime.find_host_nsys). None
    there: profile.tool auto falls back to the torch profiler, nsys is "not profiled"."""
    if decision.tool != "nsys":
        return decision
    container = runtime.get("kind") == "container"
    if container and runtime.get("nsys"):
        version = runtime.get("nsys_version")
        use = NsysUse(str(runtime["nsys"]), "image", None if version is None else str(version))
        return Decision("nsys", note=decision.note, nsys=use)
    found = host()
    why: str
    if isinstance(found, str):
        why = found
    elif not container:
        use = NsysUse(found.path, "host", found.version, host=found.to_json())
        return Decision("nsys", note=decision.note, nsys=use)
    elif found.install_dir is None:
        why = f"{found.path} is not in an install folder that can be mounted"
    elif isinstance(ran := runtime.get("host_nsys_in_image"), Mapping) and ran.get("runs") is False:
        why = str(ran.get("reason"))
    else:
        mount, inside = nsys_mount(found.install_dir, str(Path(found.path).resolve()))
        use = NsysUse(inside, "host", found.version, mount, found.to_json())
        note = f"the host's Nsight Systems {found.version or '?'} ({found.path}) mounted in"
        return Decision("nsys", note=note, nsys=use)
    if container:
        why = f"{profile.nsys} is not in {runtime.get('image_ref')} and {why}"
    if profile.tool == "auto":
        return Decision("torch", note=f"{why}; vLLM's torch profiler used")
    return Decision(None, f"{why} (see containers/README.md)" if container else why)
