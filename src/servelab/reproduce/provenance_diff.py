"""What the two sides record about their setup, field by field (the provenance diff).

A difference in a blocking field (model, runtime, vLLM version, GPU model, the measured
configuration) makes the comparison NOT COMPARABLE whatever the numbers say; a difference in a
noted field is reported. Values are compared as each side recorded them.
"""

from __future__ import annotations

from typing import Any

from servelab.reproduce.sides import Side


# (field, getter) pairs; a difference in one of these makes the comparison NOT COMPARABLE.
def _gpu_models(p: dict[str, Any]) -> Any:
    gpus = p.get("host", {}).get("gpus") or []
    return sorted(str(g.get("name")) for g in gpus) or None


def _image_digest(p: dict[str, Any]) -> Any:
    rt = p.get("runtime", {})
    for key in ("image_digest", "digest", "image_id"):
        if rt.get(key):
            return rt[key]
    image = str(rt.get("image") or "")
    return image.split("@", 1)[1] if "@" in image else None


def _cfg(section: str, *keys: str) -> Any:
    def get(p: dict[str, Any]) -> Any:
        v: Any = (p.get("config") or {}).get(section)
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


def _at(*keys: str) -> Any:
    def get(p: dict[str, Any]) -> Any:
        v: Any = p
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


# workload keys compared as notes (NOTES), not as part of the blocking `config.workload`
NOTED_WORKLOAD_KEYS = frozenset({"unique_prompts"})


def _workload(p: dict[str, Any]) -> Any:
    w = _cfg("workload")(p)
    if not isinstance(w, dict):
        return w
    return {k: v for k, v in w.items() if k not in NOTED_WORKLOAD_KEYS}


BLOCKING: list[tuple[str, Any]] = [
    ("model.source", _at("model", "source")),
    ("model.repo", _at("model", "repo")),
    ("model.revision", _at("model", "revision")),
    ("runtime.kind", _at("runtime", "kind")),
    ("runtime.lock_sha256", _at("runtime", "lock_sha256")),
    ("runtime.image_digest", _image_digest),
    ("vllm_version", _at("vllm_version")),
    ("host.gpu_models", _gpu_models),
    ("config.server.args", _cfg("server", "args")),
    ("config.server.configs", _cfg("server", "configs")),
    ("config.runtime.env", _cfg("runtime", "env")),
    ("config.workload", _workload),
    ("config.sweep.concurrency", _cfg("sweep", "concurrency")),
    ("config.sweep.rate", _cfg("sweep", "rate")),
    ("config.sweep.arrival", _cfg("sweep", "arrival")),
]
# Worth knowing, not blocking.
NOTES: list[tuple[str, Any]] = [
    ("pipeline.git_commit", _at("pipeline", "git_commit")),
    ("pipeline.servelab_version", _at("pipeline", "servelab_version")),
    ("pipeline.snakemake_version", _at("pipeline", "snakemake_version")),
    ("config.sweep.repeats", _cfg("sweep", "repeats")),
    ("config.sweep.order", _cfg("sweep", "order")),
    ("config.analysis", _cfg("analysis")),
    ("config.profile.enabled", _cfg("profile", "enabled")),
    # whether points resend the same prompts matters only with prefix caching, which the
    # prefix_cache validity check catches on every point of either side
    ("config.workload.unique_prompts", _cfg("workload", "unique_prompts")),
]


def provenance_diff(ref: Side, new: Side, host: dict[str, Any]) -> dict[str, Any]:
    """Field by field: what differs, and whether it stops the comparison being clean-room.
    `host` is the hosts' comparison (`compare_hosts`), whose differing facts are listed too."""
    rows: list[dict[str, Any]] = []
    flags: list[str] = []
    if ref.provenance is None or new.provenance is None:
        missing = [w for w, side in (("reference", ref), ("fresh", new)) if not side.provenance]
        kinds = ", ".join(sorted({ref.kind, new.kind}))
        flags.append(
            f"no provenance for the {' and '.join(missing)} side ({kinds}): "
            "model, runtime and host cannot be compared"
        )
        for key in sorted(set(ref.bench_facts) | set(new.bench_facts)):
            a, b = ref.bench_facts.get(key), new.bench_facts.get(key)
            rows.append(
                {
                    "field": f"benchmark.{key}",
                    "reference": a,
                    "fresh": b,
                    "same": a == b,
                    "effect": "blocks" if key != "label" else "note",
                }
            )
    else:
        for kind, table in (("blocks", BLOCKING), ("note", NOTES)):
            for name, get in table:
                a, b = get(ref.provenance), get(new.provenance)
                if a is None and b is None:
                    continue
                rows.append(
                    {"field": name, "reference": a, "fresh": b, "same": a == b, "effect": kind}
                )
        if host["class"] == "identical":
            flags.append(
                "every host fact is the same (CPU, cores, memory, OS, kernel): the same "
                "machine or an identical one, not shown to be another host"
            )
        if new.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the fresh run's pipeline had uncommitted changes")
        if ref.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the reference's pipeline had uncommitted changes")
    if ref.release is not None and ref.release.get("pinned") is False:
        flags.append(
            "the reference release is marked unpinned: "
            + "; ".join(ref.release.get("unpinned_reasons") or [])
        )
    blocking = [r["field"] for r in rows if r["effect"] == "blocks" and not r["same"]]
    for f in blocking:
        flags.append(f"{f} differs: not the same experiment")
    host_differs = [d["fact"] for d in host["relevant_differences"] + host["other_differences"]]
    return {
        "fields": rows,
        "differs": [r["field"] for r in rows if not r["same"]] + host_differs,
        "blocking": blocking,
        "not_clean_room": flags,
    }
