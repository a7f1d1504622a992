"""The command lines of the profiling pass: `nsys profile` in front of the server and `nsys
export` after it, vLLM's profiler settings (--profiler-config, or for the torch profiler the
VLLM_TORCH_PROFILER_* variables of older releases) and which of the two interfaces the
runtime's vLLM has. The CUDA profiler that nsys's capture range needs is started only through
--profiler-config '{"profiler": "cuda"}': the environment variable older releases read for it
(VLLM_TORCH_CUDA_PROFILE) is gone from current vLLM (0.27.1 has no such variable), so a vLLM
without --profiler-config is not profiled with nsys.

`profiler_additions` hands them to the one server launch (servelab.launch.session.build_launch) as
what the capture adds: server arguments, environment, the wrapper, the folder it writes into,
and in a container the host's Nsight Systems mounted read-only.
Everything here is pure but `vllm_interface`, which asks the runtime's Python.

`nsys profile`'s switches, as the Nsight Systems User Guide ("CLI Profile Command Switch
Options") describes them: --capture-range=cudaProfilerApi starts the collection at
cudaProfilerStart (vLLM's /start_profile with its cuda profiler); --capture-range-end=stop ends
it at cudaProfilerStop (/stop_profile) and ignores later ranges: nsys then writes the report
and prints "Generated:" and its path while the server runs on (under `repeat` the report would
only be written when the server exits); --sample=none and --cpuctxsw=none turn off CPU
sampling and context-switch tracing (they need privileges in a container, and the analysis
reads only CUDA and NVTX). vLLM's profiling guide (docs/contributing/profiling.md) runs the
server under nsys with VLLM_WORKER_MULTIPROC_METHOD=spawn, as the capture does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from servelab.env.container import Mount
from servelab.env.runtime import ask_runtime
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection
from servelab.launch.session import LaunchAdditions

NSYS_PROFILE_ARGS = (
    "profile",
    "--trace=cuda,nvtx",
    "--sample=none",
    "--cpuctxsw=none",
    "--cuda-graph-trace=node",
    "--trace-fork-before-exec=true",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--force-overwrite=true",
)
# The environment of a server profiled with nsys (vLLM's profiling guide).
NSYS_SERVER_ENV = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def nsys_profile_command(output: Path, nsys: str = "nsys") -> list[str]:
    """The prefix that runs the server under Nsight Systems (output: report path, no suffix)."""
    return [nsys, *NSYS_PROFILE_ARGS, f"--output={output}"]


def nsys_export_command(report: Path, sqlite: Path, nsys: str = "nsys") -> list[str]:
    return [
        nsys,
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        f"--output={sqlite}",
        str(report),
    ]


class TorchProfilerConfig(TypedDict):
    """vLLM's --profiler-config for a bounded CPU capture."""

    profiler: str
    torch_profiler_dir: str
    torch_profiler_with_stack: bool
    torch_profiler_record_shapes: bool
    torch_profiler_with_memory: bool
    torch_profiler_with_flops: bool
    torch_profiler_use_gzip: bool
    ignore_frontend: bool
    max_iterations: int


def torch_profiler_config(trace_dir: Path, max_iterations: int) -> TorchProfilerConfig:
    """vLLM's --profiler-config for a bounded CPU capture (names as in vllm/config/profiler.py)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "torch_profiler_record_shapes": False,
        "torch_profiler_with_memory": False,
        "torch_profiler_with_flops": False,
        "torch_profiler_use_gzip": True,
        "ignore_frontend": True,
        "max_iterations": max_iterations,
    }


def vllm_profiler_args(
    tool: str, trace_dir: Path, interface: str, max_iterations: int
) -> tuple[list[str], dict[str, str]]:
    """Server arguments and environment that enable vLLM's profiler endpoints."""
    if tool not in ("torch", "nsys"):
        raise ValueError(tool)
    if interface == "config":
        cfg = (
            torch_profiler_config(trace_dir, max_iterations)
            if tool == "torch"
            else {"profiler": "cuda"}
        )
        return ["--profiler-config", json.dumps(cfg, sort_keys=True)], {}
    if tool == "nsys":
        raise ServelabError(
            "profile.tool nsys: the runtime's vLLM has no --profiler-config (profile."
            "vllm_interface env), so /start_profile cannot start its CUDA profiler; use a vLLM "
            "with --profiler-config (vllm/config/profiler.py), or profile.tool torch"
        )
    env = {
        "VLLM_TORCH_PROFILER_DIR": str(trace_dir),
        "VLLM_TORCH_PROFILER_WITH_STACK": "0",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "0",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "0",
        "VLLM_TORCH_PROFILER_WITH_FLOPS": "0",
    }
    if max_iterations:
        env["VLLM_PROFILER_MAX_ITERS"] = str(max_iterations)
    return [], env


def vllm_interface(python: str) -> str:
    """'config' when the runtime's vLLM has --profiler-config (vllm/config/profiler.py), else
    'env' (older releases read VLLM_TORCH_* variables). Looked up without importing vLLM."""
    code = (
        "import importlib.util, os; s = importlib.util.find_spec('vllm'); "
        "print(os.path.isfile(os.path.join(list(s.submodule_search_locations)[0], "
        "'config', 'profiler.py')))"
    )
    return "env" if ask_runtime(python, code) == "False" else "config"


def profiler_interface(profile: ProfileSection, runtime: Mapping[str, object]) -> str:
    """profile.vllm_interface, or for auto what the runtime's vLLM has: in a container the
    runtime stage looked inside the image (runtime.json "profiler_config"); a venv is asked."""
    if profile.vllm_interface != "auto":
        return profile.vllm_interface
    if runtime.get("kind") == "container":
        return "env" if runtime.get("profiler_config") is False else "config"
    return vllm_interface(str(runtime["python"]))


def profiler_additions(
    tool: str,
    out: Path,
    *,
    interface: str,
    nsys: str,
    max_iterations: int,
    mounts: Sequence[Mount] = (),
) -> LaunchAdditions:
    """What the capture adds to the server's launch: vLLM's profiler arguments and
    environment (torch traces go to <out>/torch-raw), for nsys `nsys profile` in front of the
    server (report <out>/nsys/profile) and NSYS_SERVER_ENV, <out> as a folder the server
    writes into (in a container: mounted at its own path) and `mounts` (in a container: the
    host's Nsight Systems)."""
    args, env = vllm_profiler_args(tool, (out / "torch-raw").resolve(), interface, max_iterations)
    wrapper: list[str] = []
    if tool == "nsys":
        wrapper = nsys_profile_command((out / "nsys" / "profile").resolve(), nsys)
        env = {**env, **NSYS_SERVER_ENV}
    return LaunchAdditions(
        args=tuple(args),
        env=env,
        wrapper=tuple(wrapper),
        writable=(out,),
        mounts=tuple(mounts),
    )
