"""What the two sides record about their setup, field by field (the provenance diff).

A difference in a blocking field (model, runtime, vLLM version, GPU model, the measured
configuration) makes the comparison NOT COMPARABLE whatever the numbers say; a difference in a
noted field is reported. Values are compared as each side recorded them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict, TypeVar

from servelab.analysis.engine_diff import compare_engines, launches_of
from servelab.documents.declared import (
    FieldRow,
    HostComparison,
    Provenance,
    ProvenanceDiff,
)
from servelab.reproduce.sides import Side
from servelab.store.paths import CLIENTS_FILE
from servelab.store.records import ClientsRecord


class EndpointSide(TypedDict):
    """A side measured on a server servelab did not launch: its URL, served model, what the
    server said of its model, and whether it ran on the client's host."""

    url: str | None
    served_model: str | None
    root: str | None
    max_model_len: int | None
    local: bool | None


# what a field of the provenance diff reads of a side's provenance (None: not recorded)
Getter = Callable[[Provenance], object]


# (field, getter) pairs; a difference in one of these makes the comparison NOT COMPARABLE.
def _gpu_models(p: Provenance) -> list[str] | None:
    gpus = p.get("host", {}).get("gpus") or []
    return sorted(str(g.get("name")) for g in gpus) or None


def _image_digest(p: Provenance) -> object:
    rt: Mapping[str, object] = p.get("runtime") or {}  # releases of any age: keys vary
    for key in ("image_digest", "digest", "image_id"):
        if rt.get(key):
            return rt[key]
    image = str(rt.get("image") or "")
    return image.split("@", 1)[1] if "@" in image else None


def _cfg(section: str, *keys: str) -> Getter:
    def get(p: Provenance) -> object:
        v: object = (p.get("config") or {}).get(section)
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


def _at(*keys: str) -> Getter:
    def get(p: Provenance) -> object:
        v: object = p
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    return get


# workload keys compared as notes (NOTES), not as part of the blocking `config.workload`
NOTED_WORKLOAD_KEYS = frozenset({"unique_prompts"})


def _workload(p: Provenance) -> object:
    w = _cfg("workload")(p)
    if not isinstance(w, dict):
        return w
    return {k: v for k, v in w.items() if k not in NOTED_WORKLOAD_KEYS}


BLOCKING: list[tuple[str, Getter]] = [
    ("model.source", _at("model", "source")),
    ("model.repo", _at("model", "repo")),
    # a running server's model (runtime.kind endpoint): the name it serves
    ("model.served_model", _at("model", "served_model")),
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
NOTES: list[tuple[str, Getter]] = [
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


def endpoint_of(side: Side) -> EndpointSide | None:
    """A side measured on a server servelab did not launch (runtime.kind endpoint): its URL,
    served model and what the server said of its model; None for any other side."""
    prov, cfg = side.provenance, side.config
    runtime = _fields((prov and prov.get("runtime")) or (cfg and cfg.get("runtime")))
    if runtime.get("kind") != "endpoint":
        return None
    model = _fields((prov and prov.get("model", {}).get("model")) or runtime.get("model"))
    return {
        "url": _of(str, runtime.get("url")),
        "served_model": _of(str, runtime.get("served_model")),
        "root": _of(str, model.get("root")),
        "max_model_len": _of(int, model.get("max_model_len")),
        "local": _of(bool, runtime.get("local")),
    }


_T = TypeVar("_T")


def _fields(v: object) -> Mapping[str, object]:
    """A block of a side's provenance or config (its runtime, its served model) as its fields;
    none where it is absent."""
    return v if isinstance(v, Mapping) else {}


def _of(kind: type[_T], v: object) -> _T | None:
    """A recorded value of the type its document declares; None where it is absent."""
    return v if isinstance(v, kind) else None


def not_checked(ref: Side, new: Side) -> list[str]:
    """What the comparison cannot check of a side measured on a server servelab did not
    launch, one line each: its runtime (lock or image), its command line and arguments, its
    model files and, for a server elsewhere, the server's host; empty when both sides
    launched their servers."""
    lines: list[str] = []
    for label, side in (("reference", ref), ("fresh run", new)):
        e = endpoint_of(side)
        if e is None:
            continue
        where = f"the {label}'s server at {e['url']} was not launched by servelab"
        lines += [
            f"runtime lock or image: {where}; its software is not pinned (only the vLLM "
            "version it reports is compared)",
            f"server command line and arguments: {where}; they are not recorded, so its "
            "configuration is compared by name only",
            f"model files: the {label} measured {e['served_model']!r} as its server serves "
            f"it (root {e['root']}, max_model_len {e['max_model_len']}); no file of it is "
            "pinned, only its name is compared",
        ]
        if e["local"] is False:
            lines.append(
                f"the server's host: the {label}'s server ran on another host than its client; "
                "the host facts compared are the client's"
            )
    return lines


def tool_rows(reference: Path, fresh: Path) -> list[FieldRow]:
    """client.cross_check's tools on each side (runtime/clients.json), each as its version and
    lock, compared as notes: the verdicts judge servelab's own client, but "Clients compared"
    changes with the tools that measured beside it."""

    def tools(root: Path) -> dict[str, str]:
        record = ClientsRecord.read_if_present(root / "runtime" / CLIENTS_FILE)
        listed = {} if record is None else record.doc["tools"]
        return {
            name: f"{t['version']} (lock sha256 {t['lock_sha256'][:16]})"
            for name, t in listed.items()
        }

    a, b = tools(reference), tools(fresh)
    return [
        {
            "field": f"client_tools.{name}",
            "reference": a.get(name),
            "fresh": b.get(name),
            "same": a.get(name) == b.get(name),
            "effect": "note",
        }
        for name in sorted(set(a) | set(b))
    ]


def provenance_diff(
    ref: Side,
    new: Side,
    host: HostComparison,
    names: tuple[str, str] = ("the reference", "the fresh run"),
) -> ProvenanceDiff:
    """Field by field: what differs, and whether it stops the comparison being clean-room.
    `host` is the hosts' comparison (`compare_hosts`), whose differing facts are listed too;
    `names`, the two sides as the engine settings' comparison names them."""
    rows: list[FieldRow] = []
    flags: list[str] = []
    if ref.provenance is None or new.provenance is None:
        missing = [w for w, side in (("reference", ref), ("fresh", new)) if not side.provenance]
        kinds = ", ".join(sorted({ref.kind, new.kind}))
        flags.append(
            f"no provenance for the {' and '.join(missing)} side ({kinds}): "
            "model, runtime and host cannot be compared"
        )
        for key in sorted(set(ref.bench_facts) | set(new.bench_facts)):
            x, y = ref.bench_facts.get(key), new.bench_facts.get(key)
            rows.append(
                {
                    "field": f"benchmark.{key}",
                    "reference": x,
                    "fresh": y,
                    "same": x == y,
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
        rows += tool_rows(ref.root, new.root)
        if host["class"] == "identical":
            flags.append(
                "every host fact is the same (CPU, cores, memory, OS, kernel): the same "
                "machine or an identical one, not shown to be another host"
            )
        if new.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the fresh run's pipeline had uncommitted changes")
        if ref.provenance.get("pipeline", {}).get("git_dirty"):
            flags.append("the reference's pipeline had uncommitted changes")
    for label, side in (("reference", ref), ("fresh run", new)):
        e = endpoint_of(side)
        if e is not None:
            flags.append(
                f"the {label} measured a server servelab did not launch ({e['url']}): its "
                "runtime, arguments and model files could not be checked (not_checked)"
            )
    if ref.release is not None and ref.release.get("pinned") is False:
        reasons = ref.release.get("unpinned_reasons")
        listed = reasons if isinstance(reasons, list) else []
        flags.append("the reference release is marked unpinned: " + "; ".join(map(str, listed)))
    blocking = [r["field"] for r in rows if r["effect"] == "blocks" and not r["same"]]
    for f in blocking:
        flags.append(f"{f} differs: not the same experiment")
    ra, na = launches_of(ref.root), launches_of(new.root)
    engine = compare_engines(ra, na, [(sc, sc) for sc in sorted(set(ra) & set(na))], names)
    blocking += engine["blocking"]
    host_differs = [d["fact"] for d in host["relevant_differences"] + host["other_differences"]]
    return {
        "fields": rows,
        "differs": [r["field"] for r in rows if not r["same"]] + host_differs,
        "blocking": blocking,
        "not_clean_room": flags,
        "not_checked": not_checked(ref, new),
        "engine": engine,
    }
