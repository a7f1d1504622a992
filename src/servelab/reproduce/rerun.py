"""Re-run a reference's server beside the current side, on this host (`servelab rerun`).

"Did the code get slower?" cannot be answered across hosts or days by a canary: two quiet runs
of the same code on one 2-core host class differ by tens of percent. It is answered by
measuring both sides here, interleaved: `rerun_config` derives one experiment from

- the reference (a release folder, a release tarball or a bundle, verified first): its model
  recipe and revision, its runtime (the lock's bytes the bundle carries, or the image by
  digest), its server arguments and its workload and levels, each point WAVES_FACTOR times
  longer (workload.waves) unless told otherwise;
- the current side: another bundle of the same kinds, or (none given) this checkout: the
  reference's server arguments on the runtime of the current experiment config.

Each of the reference's server configurations `x` becomes two: `reference-x` and `current-x`,
measured in one sequential, interleaved plan (`sweep.repeats: {min, max, interleave: true}`:
each round on a fresh launch of each side in turn, A B then B A), and compared in
`analysis.compare` (servelab.analysis.samehost): SAME, DIFFERENT or UNKNOWN per level and
metric, measuring stops once every one is SAME or DIFFERENT, or at `max` rounds. Today's client
measures both sides; the reference's own numbers are not used.

Refused, in one line naming the missing piece: a side whose bundle lacks what a re-run needs
(the lock's bytes, where no lock of this checkout's envs/ has the recorded sha256; the model
recipe), a server servelab did not launch (runtime.kind endpoint), two sides that serve
different models, and a current side that drops a server argument the reference sets for
every configuration.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import psutil

from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT
from servelab.documents import JsonObject, JsonValue
from servelab.errors import ServelabError
from servelab.reproduce.sides import (
    ArgValue,
    ConfigRuntimeJson,
    ResolvedConfig,
    ServerConfigJson,
    ServerJson,
    Side,
)
from servelab.store.hashing import pinned_bytes
from servelab.store.paths import RUNTIME_FILE
from servelab.store.records import RuntimeRecord

REFERENCE, CURRENT = "reference", "current"
# rounds 3 to 10: side by side in slices, a 2-core host's spread of the log ratio was about 4%
# at c >= 4, which 6 rounds at 1 - 2 x 0.05 / (9 rows x looks) leave just outside a 10% margin
# and 8 to 10 bring inside it (benchmarks/README.md, "Slices"); the rounds stop at the first
# look where every row is decided
DEFAULT_ROUNDS = (3, 10)
# a rerun's points are this many times longer than the reference's (workload.waves): every
# round pays a server start per side, so a longer window costs little more wall time and
# narrows the round-to-round spread the words rest on (benchmarks/README.md, "Same-host
# verdicts")
WAVES_FACTOR = 4
# side by side, a rerun sends each point in slices of this many waves that alternate between the
# two sides' servers (sweep.repeats.slices): about 2 s at the reference's concurrencies on a
# 2-core host, where the drift that slices cancel is slower (benchmarks/README.md, "Slices")
SLICE_WAVES = 2
# what a CPU server holds besides its KV cache (the model, the engine, the API server): the
# default experiment's server peaks under 1 GiB of RSS; 2 GiB leaves room for a larger model
SERVER_OVERHEAD_GIB = 2.0
# the sections a side's model is identified by (a re-run serves one model)
MODEL_KEYS = ("source", "tiny", "repo", "revision", "path", "files", "sha256")


@dataclass(frozen=True)
class RerunOptions:
    """How the derived experiment measures and judges: its name, where its results go, the
    equivalence margin, the rounds (min, max), the reference configurations to re-run (None:
    every one) and the waves of each point."""

    name: str | None = None
    results_dir: str = "results"
    margin_pct: float = DEFAULT_MARGIN_PCT
    rounds: tuple[int, int] = DEFAULT_ROUNDS
    configs: tuple[str, ...] | None = None
    waves: int | None = None  # None: WAVES_FACTOR x the reference's
    # both sides' servers of a round up at once, their points alternating (sweep.repeats.
    # side_by_side); None: wherever the runtime runs on CPUs and the host's memory holds both
    side_by_side: bool | None = None
    slices: int | None = None  # side by side: None, waves // SLICE_WAVES; 1, whole points


class RerunConfig(TypedDict):
    """The experiment config `rerun_config` derives (rerun.yaml): the reference's sections,
    its server configurations doubled (reference-x, current-x), each point's waves, the
    interleaved rounds and the comparison of each pair."""

    experiment: str
    results_dir: str
    model: JsonValue
    runtime: dict[str, object]
    server: ServerJson
    workload: JsonObject
    sweep: JsonObject
    telemetry: JsonValue
    analysis: dict[str, object]
    profile: dict[str, bool]
    reference: None


@dataclass(frozen=True)
class Runtime:
    """A side's runtime as the derived config names it: a lock path (venv) or an image."""

    lock: str | None = None
    lock_sha256: str | None = None
    image: str | None = None
    image_sha256: str | None = None

    def as_config(self) -> ConfigRuntimeJson:
        if self.lock is not None:
            return {"lock": self.lock}
        out: ConfigRuntimeJson = {"image": self.image}
        if self.image_sha256:
            out["image_sha256"] = self.image_sha256
        return out

    def same(self, other: Runtime) -> bool:
        if self.lock_sha256 is not None or other.lock_sha256 is not None:
            return self.lock_sha256 == other.lock_sha256
        return (self.image, self.image_sha256) == (other.image, other.image_sha256)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lock_bytes(side: Side, sc: str | None, repo: Path) -> tuple[bytes, str]:
    """The bytes of the lock `side`'s runtime (configuration `sc`'s own where it has one) was
    created from, and where they were found: a lock of this checkout's envs/ with the recorded
    sha256 (its path, relative to `repo`: the venv it made is reused), else the bundle's copy
    (runtime/[<sc>/]<lock>). Refused naming what is missing."""
    name, want = _recorded_lock(side, sc)
    for cand in sorted((repo / "envs").glob("*.lock")):
        data = pinned_bytes(cand, want)
        if data is not None:
            return data, str(cand.relative_to(repo))
    beside = side.root / "runtime" / (sc or "") / name
    data = pinned_bytes(beside, want)
    if data is not None:
        return data, f"the bundle's {beside.relative_to(side.root)}"
    raise ServelabError(
        f"{side.given}: the bundle does not carry the bytes of its lock {name} (sha256 "
        f"{want[:16]}) and no lock in envs/ has that sha256; a re-run needs that lock: add it "
        "to envs/ (e.g. `servelab lock` at the same versions) or re-run from a newer release"
    )


def _recorded_lock(side: Side, sc: str | None) -> tuple[str, str]:
    """The file name and sha256 of the lock the bundle's runtime record (configuration `sc`'s
    own where given) names; refused where the bundle has no such record."""
    rel = f"runtime/{sc + '/' if sc else ''}{RUNTIME_FILE}"
    record = RuntimeRecord.read_if_present(side.root / rel)
    if record is None:
        raise ServelabError(f"{side.given}: the bundle lacks {rel}; it cannot be re-run")
    name, want = record.get("lock"), record.get("lock_sha256")
    if not name or not want:
        raise ServelabError(f"{side.given}: {rel} records no lock or sha256; re-run refused")
    return Path(str(name)).name, str(want)


def _runtime(side: Side, cfg: ResolvedConfig, sc: str, out: Path, repo: Path) -> Runtime:
    """Configuration `sc`'s runtime on `side`: its lock written under `out`/locks, or its image."""
    rt = cfg["runtime"]
    own = next((c.get("runtime") for c in cfg["server"]["configs"] if c["name"] == sc), None)
    if rt.get("kind") == "endpoint":
        raise ServelabError(
            f"{side.given}: measured a running server (runtime.kind endpoint) that servelab did "
            "not launch; there is nothing to re-run"
        )
    if rt.get("kind") != "venv":
        image = (own or {}).get("image") or rt.get("image")
        sif = (own or {}).get("image_sha256") or rt.get("image_sha256")
        return Runtime(image=image, image_sha256=sif)
    own_sc = sc if own and own.get("lock") else None
    data, found = lock_bytes(side, own_sc, repo)
    sha = _sha(data)
    if not found.startswith("the bundle's"):  # a lock of envs/: its venv is reused
        return Runtime(lock=found, lock_sha256=sha)
    # the bundle's copy, under its own name (the venv is named after it and its sha256), in a
    # folder per sha256 so that two locks of one name do not meet
    dest = out / "locks" / sha[:16] / _recorded_lock(side, own_sc)[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    return Runtime(lock=str(dest), lock_sha256=sha)


def _model(cfg: ResolvedConfig, given: str) -> JsonObject:
    model = cfg.get("model")
    if not isinstance(model, dict) or not model.get("source"):
        raise ServelabError(f"{given}: config.resolved.yaml records no model recipe (model.source)")
    if model["source"] == "tiny" and not isinstance(model.get("tiny"), dict):
        raise ServelabError(f"{given}: config.resolved.yaml lacks model.tiny, the model's recipe")
    return model


def _args(cfg: ResolvedConfig, sc: str) -> dict[str, ArgValue]:
    """Configuration `sc`'s server arguments: the shared ones with its own over them."""
    own = next(c for c in cfg["server"]["configs"] if c["name"] == sc)
    return {**(cfg["server"].get("args") or {}), **(own.get("args") or {})}


def _own_args(
    full: dict[str, ArgValue], shared: dict[str, ArgValue], given: str, sc: str
) -> dict[str, ArgValue]:
    dropped = sorted(k for k in shared if k not in full)
    if dropped:
        raise ServelabError(
            f"{given}: configuration {sc} does not set --{dropped[0]}, which the reference sets "
            "for every configuration; a re-run cannot remove a shared argument"
        )
    return {k: v for k, v in full.items() if k not in shared or shared[k] != v}


def _current_config(current: Side | None, this: ResolvedConfig) -> ResolvedConfig:
    if current is None:
        return copy.deepcopy(this)
    if not current.config:
        raise ServelabError(f"{current.given}: not a bundle with config.resolved.yaml")
    return copy.deepcopy(current.config)


def rerun_config(
    reference: Side,
    current: Side | None,
    this_checkout: ResolvedConfig,
    out: Path,
    repo: Path,
    opts: RerunOptions = RerunOptions(),
) -> RerunConfig:
    """The experiment config that re-runs `reference` beside `current` (None: the reference's
    servers on `this_checkout`'s runtime, the current experiment config resolved); locks are
    written under `out`. See the module docstring for what each side contributes."""
    ref = copy.deepcopy(reference.config or {})
    if not ref:
        raise ServelabError(f"{reference.given}: not a bundle with config.resolved.yaml")
    cur = _current_config(current, this_checkout)
    cur_given = current.given if current is not None else "this checkout"
    model = _model(ref, reference.given)
    cur_model = _model(cur, cur_given) if current is not None else model
    differs = [k for k in MODEL_KEYS if model.get(k) != cur_model.get(k)]
    if differs:
        raise ServelabError(
            f"{cur_given}: serves another model than {reference.given} (model.{differs[0]} "
            "differs); a re-run compares one model's servers"
        )
    names = [c["name"] for c in ref["server"]["configs"]]
    chosen = list(opts.configs) if opts.configs else names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ServelabError(
            f"--config {unknown[0]}: not a server configuration of {reference.given} "
            f"({', '.join(names)})"
        )
    cur_names = [c["name"] for c in cur["server"]["configs"]]
    shared = dict(ref["server"].get("args") or {})
    configs: list[ServerConfigJson] = []
    pairs: list[dict[str, str]] = []
    runtimes: list[Runtime] = []
    for sc in chosen:
        ref_rt = _runtime(reference, ref, sc, out, repo)
        if current is not None:
            if sc not in cur_names:
                raise ServelabError(
                    f"{cur_given}: has no server configuration {sc} to compare with the "
                    f"reference's (it has {', '.join(cur_names)}); choose one with --config"
                )
            cur_rt = _runtime(current, cur, sc, out, repo)
            cur_args = _args(cur, sc)
        else:
            cur_rt = _this_runtime(this_checkout, repo)
            cur_args = _args(ref, sc)
        a, b = f"{REFERENCE}-{sc}", f"{CURRENT}-{sc}"
        configs.append({"name": a, "args": _own_args(_args(ref, sc), shared, reference.given, sc)})
        configs.append({"name": b, "args": _own_args(cur_args, shared, cur_given, sc)})
        runtimes += [ref_rt, cur_rt]
        pairs.append({"a": a, "b": b})
    # the first configuration's runtime is the experiment's; every other one differing from
    # it is that configuration's own (config_runtime), so that one lock makes one venv
    for entry, rt in zip(configs[1:], runtimes[1:], strict=True):
        if not rt.same(runtimes[0]):
            entry["runtime"] = rt.as_config()
    return _derived(ref, configs, pairs, runtimes[0], opts, reference)


def _this_runtime(cfg: ResolvedConfig, repo: Path) -> Runtime:
    rt = cfg["runtime"]
    if rt.get("kind") == "endpoint":
        raise ServelabError(
            "this checkout's config measures a running server (runtime.kind endpoint); give the "
            "current side as a bundle, or a config that launches one"
        )
    if rt.get("kind") != "venv":
        return Runtime(image=rt.get("image"), image_sha256=rt.get("image_sha256"))
    path = Path(rt["lock"]) if Path(rt["lock"]).is_absolute() else repo / rt["lock"]
    if not path.is_file():
        raise ServelabError(f"runtime.lock: {path} not found; run from the repository root")
    return Runtime(lock=str(rt["lock"]), lock_sha256=_sha(path.read_bytes()))


def _derived(
    ref: ResolvedConfig,
    configs: list[ServerConfigJson],
    pairs: list[dict[str, str]],
    first: Runtime,
    opts: RerunOptions,
    reference: Side,
) -> RerunConfig:
    name = experiment_name(reference, opts)
    levels = {k: v for k, v in ref["sweep"].items() if k in ("concurrency", "rate")}
    recorded = ref["workload"].get("waves")
    waves = int(recorded) if isinstance(recorded, int | float) and recorded else 1
    runtime = {**ref["runtime"], **first.as_config()}
    lo, hi = opts.rounds
    together = opts.side_by_side
    if together is None:
        together = runtime.get("device", "cpu") == "cpu" and memory_holds(runtime, len(configs))
    waves = opts.waves or WAVES_FACTOR * waves
    slices = 1
    if together and "rate" not in levels:
        slices = opts.slices or max(1, waves // SLICE_WAVES)
    return {
        "experiment": name,
        "results_dir": opts.results_dir,
        "model": ref["model"],
        "runtime": runtime,
        "server": {**ref["server"], "configs": configs},
        "workload": {**ref["workload"], "waves": waves},
        "sweep": {
            **levels,
            "repeats": {
                "min": lo,
                "max": hi,
                "interleave": True,
                "side_by_side": together,
                "slices": min(slices, waves),
            },
        },
        "telemetry": ref.get("telemetry", {}),
        "analysis": {
            **{k: v for k, v in ref.get("analysis", {}).items() if k not in ("claims", "pairs")},
            "claims": [],
            "margin_pct": opts.margin_pct,
            "compare": pairs,
        },
        "profile": {"enabled": False},
        "reference": None,
    }


def memory_holds(runtime: Mapping[str, object], servers: int) -> bool:
    """Whether this host's available memory holds `servers` CPU servers at once: each its KV
    cache (runtime.env VLLM_CPU_KVCACHE_SPACE GiB, vLLM's default 4 where unset) and
    SERVER_OVERHEAD_GIB for the model, the engine and the API server; false where the
    available memory cannot be read."""
    env = runtime.get("env")
    space = env.get("VLLM_CPU_KVCACHE_SPACE") if isinstance(env, Mapping) else None
    try:
        kv_gib = float(space) if isinstance(space, str | int | float) and space else 4.0
    except ValueError:
        kv_gib = 4.0
    available = available_memory_bytes()
    need = servers * (kv_gib + SERVER_OVERHEAD_GIB) * 2**30
    return available is not None and available >= need


def available_memory_bytes() -> int | None:
    """The memory this host has available now, in bytes, as psutil reads it (the telemetry's
    source too); None where it cannot be read."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def experiment_name(reference: Side, opts: RerunOptions) -> str:
    """The derived experiment's name: the option's, else rerun-<the reference's experiment>."""
    prov, cfg = reference.provenance, reference.config
    exp = (prov and prov.get("experiment")) or (cfg and cfg.get("experiment")) or "reference"
    return opts.name or f"rerun-{exp}"


def header(reference: Side, current: Side | None) -> str:
    """The comment the derived config file starts with: what it re-runs, from where."""
    tag = (reference.release or {}).get("tag")
    lines = [
        "# Written by `servelab rerun`: the reference's server beside the current side, "
        "measured interleaved on this host",
        f"# reference: {reference.given}" + (f" (release {tag})" if tag else ""),
        f"# current: {current.given if current is not None else 'this checkout'}",
    ]
    return "\n".join(lines) + "\n"
