"""Which server configurations the profiling pass captures, and with which tool.

`profile_plan` decides before anything starts (the workflow reads it to plan the jobs) and
raises when profile.required is true and profiling cannot happen; `for_runtime` revises a
decision with what the runtime stage found in a container image.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servelab.container import ENGINES
from servelab.errors import ServelabError
from servelab.experiment import Experiment, ProfileSection

TOOLS = ("auto", "torch", "nsys", "none")


@dataclass(frozen=True)
class Decision:
    tool: str | None  # torch | nsys | None (not profiled)
    reason: str | None = None
    note: str | None = None


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
    exp: Experiment, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Decision]:
    """What each profiled configuration will get; raises before anything starts when
    profiling is required and cannot happen."""
    p = exp.profile
    device = exp.runtime.device
    tool = p.tool
    # in a container, nsys is the image's (or a mount's): the runtime stage looks for it there
    # (runtime.json "nsys"), and for_runtime() revises this decision
    nsys_found = exp.runtime.kind in ENGINES or which(p.nsys) is not None
    decision: Decision
    if not p.enabled:
        decision = Decision(None, "profile.enabled is false")
    elif tool == "none":
        decision = Decision(None, "profile.tool is none")
    elif tool == "nsys" and device != "gpu":
        decision = Decision(None, "profile.tool nsys needs runtime.device gpu")
    elif tool == "nsys" and not nsys_found:
        decision = Decision(None, f"nsys ({p.nsys}) not found on PATH")
    elif tool == "auto" and device == "gpu":
        decision = (
            Decision("nsys")
            if nsys_found
            else Decision("torch", note=f"nsys ({p.nsys}) not found; vLLM's torch profiler used")
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


def for_runtime(
    decision: Decision, profile: ProfileSection, runtime: Mapping[str, Any]
) -> Decision:
    """The plan's decision, revised by what the runtime stage found in a container image."""
    if runtime.get("kind") != "container" or decision.tool != "nsys" or runtime.get("nsys"):
        return decision
    where = f"{profile.nsys} is not in {runtime.get('image_ref')}"
    if profile.tool == "auto":
        return Decision("torch", note=f"{where}; vLLM's torch profiler used")
    return Decision(None, f"{where} (see containers/README.md)")
