"""The comparison: open both sides, run the checks, reach the verdict, write the outputs."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from servelab.analysis.dataset import Dataset, load_dataset
from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT
from servelab.analysis.hostspeed import (
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    UNKNOWN,
    Gate,
    HostRatio,
    HostSpeed,
    host_ratio,
    read_host_speed,
    rerun_command,
    why_no_ratio,
)
from servelab.claims_syntax import parse_claim
from servelab.config import default_section
from servelab.documents.declared import (
    DatasetFacts,
    HostComparison,
    HostSpeedRecord,
    Provenance,
    ReproductionRecord,
    ReproductionSettings,
)
from servelab.errors import ServelabError
from servelab.evidence.schemas import validate_file
from servelab.experiment import AnalysisSection, Experiment, ReproductionSection
from servelab.hostfacts import compare_hosts
from servelab.reproduce.checks import (
    FDR_Q,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    POINT_METRICS,
    REPRODUCED,
    align_configs,
    analyse,
    attribute_points,
    chain_rows,
    claim_rows,
    ordering_claims,
    pair_rows,
    point_rows,
)
from servelab.reproduce.markdown import report_markdown
from servelab.reproduce.provenance_diff import provenance_diff
from servelab.reproduce.records import host_speed_json
from servelab.reproduce.sides import Side, open_side
from servelab.store.jsonio import write_json
from servelab.store.paths import ExperimentPaths

FORMAT_VERSION = 1


def reference_claims(side: Side, s: ReproductionSection) -> list[str]:
    """The reference's own claims, then the extra claims of `reproduction.claims`."""
    own = list(side.analysis.claims)
    return own + [c for c in s.claims if c not in own]


def _check_settings(claims: list[str], s: ReproductionSection) -> None:
    """Claims parse and metrics exist, before anything is analysed: one line naming the first
    that does not."""
    for claim in claims:
        try:
            parse_claim(claim)
        except ServelabError as exc:
            raise ServelabError(f"claims: {exc}") from None
    unknown = [m for m in (*s.metrics, *s.tolerance_metrics) if m not in POINT_METRICS]
    if unknown:
        raise ServelabError(
            f"reproduction.metrics: {unknown[0]!r} is not one of {', '.join(POINT_METRICS)}"
        )


def _overall(blocking: list[str], judged: list[str]) -> tuple[str, str]:
    """The verdict over every judged check, and why."""
    if blocking:
        return NOT_COMPARABLE, "provenance differs: " + ", ".join(blocking)
    if not judged:
        return NOT_COMPARABLE, "the reference has no ordering or claim to check"
    if NOT_REPRODUCED in judged:
        n = judged.count(NOT_REPRODUCED)
        return NOT_REPRODUCED, f"{n} of {len(judged)} checks not reproduced"
    if NOT_COMPARABLE in judged:
        n = judged.count(NOT_COMPARABLE)
        return NOT_COMPARABLE, f"{n} of {len(judged)} checks have no fresh data"
    return REPRODUCED, f"all {len(judged)} checks reproduced"


def _fields(v: object) -> Mapping[str, object]:
    """A block of a provenance or a config (a dataset or trace file, a window, a hub file) as
    its fields; none where it is absent."""
    return v if isinstance(v, Mapping) else {}


def _dataset_text(d: DatasetFacts | None) -> str:
    if not d:
        return "synthetic prompts"
    f = _fields(d.get("file"))
    name = f.get("path") or f"{f.get('repo_id')}/{f.get('filename')}"
    return f"dataset {name} (sha256 {str(f.get('sha256'))[:12]})"


def other_dataset(ref: DatasetFacts | None, new: DatasetFacts | None) -> str | None:
    """Why two sides' prompts (provenance.json `dataset`) are not from the same dataset file,
    in one line; None when they are, or both are synthetic."""
    a = _fields(ref.get("file")).get("sha256") if ref else None
    b = _fields(new.get("file")).get("sha256") if new else None
    if a == b:
        return None
    return (
        f"the reference was measured on {_dataset_text(ref)}, the fresh run on "
        f"{_dataset_text(new)}: runs on different datasets are not compared"
    )


# how a replay fitted the trace to its server (window.fit; absent: as recorded), and each
# key's value where a record has none
FIT_KEYS = {"length_scale": 1, "max_output_tokens": None, "over_limit": "drop"}


def _fit_of(window: Mapping[str, object]) -> tuple[object, ...]:
    """A window record's fit (length_scale, max_output_tokens, over_limit)."""
    fit = _fields(window.get("fit"))
    return tuple(fit.get(k, v) for k, v in FIT_KEYS.items())


def _fit_text(fit: tuple[object, ...]) -> str:
    said = [f"{k} {v}" for (k, d), v in zip(FIT_KEYS.items(), fit, strict=True) if v != d]
    return f", {', '.join(said)}" if said else ""


def _trace_text(t: Mapping[str, object] | None) -> str:
    if not t:
        return "no trace"
    f, w = _fields(t.get("file")), _fields(t.get("window"))
    name = f.get("path") or f"{f.get('repo_id')}/{f.get('filename')}"
    return (
        f"trace {name} (sha256 {str(f.get('sha256'))[:12]}, window {w.get('start_s')} s "
        f"+ {w.get('duration_s')} s{_fit_text(_fit_of(w))})"
    )


def other_trace(ref: Mapping[str, object] | None, new: Mapping[str, object] | None) -> str | None:
    """Why two sides (provenance.json `trace`) did not replay the same trace window, in one
    line: another file, or another window (start, duration) or fit to the server (length_scale,
    max_output_tokens, over_limit); None when they did, or neither replayed a trace."""

    def key(t: Mapping[str, object] | None) -> tuple[object, ...] | None:
        if not t:
            return None
        w = _fields(t.get("window"))
        file = _fields(t.get("file")).get("sha256")
        return (file, w.get("start_s"), w.get("duration_s"), *_fit_of(w))

    if key(ref) == key(new):
        return None
    return (
        f"the reference replayed {_trace_text(ref)}, the fresh run {_trace_text(new)}: "
        "replays of different traces or windows are not compared"
    )


def _runtime_of(prov: Provenance, sc: str) -> tuple[str | None, str | None]:
    """A configuration's runtime in a side's provenance: its own (`config_runtimes`) or the
    shared one, as (lock sha256 or image digest, vLLM release)."""
    own = (prov.get("config_runtimes") or {}).get(sc)
    if own is not None:
        return own.get("lock_sha256") or own.get("image_digest"), own.get("vllm_version")
    rt = prov.get("runtime")
    pin = (rt.get("lock_sha256") or rt.get("image_digest")) if rt is not None else None
    return pin, prov.get("vllm_version")


def other_runtime(ref: Provenance, new: Provenance) -> str | None:
    """Why a configuration that has a runtime of its own on either side (server.configs[].runtime)
    may not be compared across the two runs, in one line: it ran on another runtime on the
    other side. None when every such configuration ran on the same runtime on both."""
    own = set(ref.get("config_runtimes") or {}) | set(new.get("config_runtimes") or {})
    both = set(ref.get("servers") or {}) & set(new.get("servers") or {})
    for sc in sorted(own & both):
        (a, va), (b, vb) = _runtime_of(ref, sc), _runtime_of(new, sc)
        if a != b:
            return (
                f"server config {sc!r} ran on vLLM {va} ({str(a)[:12]}) in the reference and "
                f"on vLLM {vb} ({str(b)[:12]}) in the fresh run: runtimes are compared within "
                "one run, as configurations with their own runtime (server.configs[].runtime), "
                "not across runs"
            )
    return None


def aggregates_notes(rds: Dataset, nds: Dataset) -> list[str]:
    """A side whose points were read from a tool's aggregates only, said in the verdict."""
    out = []
    for label, ds in (("reference", rds), ("fresh run", nds)):
        n = sum(1 for p in ds.points if p.extra.get("aggregates_only"))
        if n:
            out.append(
                f"the {label}'s results are aggregates only in {n} of its {len(ds.points)} "
                "points (vllm bench without --save-detailed): no validity check ran on them, "
                "and their percentiles are the tool's, without an interval"
            )
    return out


def compare_sides(ref: Side, new: Side, s: ReproductionSection) -> ReproductionRecord:
    """Both sides analysed with the reference's options, checked, and judged: the content of
    reproduction.json. Sides measured on different datasets, or with a configuration of its own
    runtime on another runtime, are refused (one line)."""
    if ref.provenance is not None and new.provenance is not None:
        why = other_dataset(ref.provenance.get("dataset"), new.provenance.get("dataset"))
        why = why or other_trace(ref.provenance.get("trace"), new.provenance.get("trace"))
        why = why or other_runtime(ref.provenance, new.provenance)
        if why is not None:
            raise ServelabError(why)
    opts = ref.analysis  # both sides are analysed with the reference's analysis options
    claims = reference_claims(ref, s)
    _check_settings(claims, s)
    # both sides checked with the reference's validity thresholds (its analysis: section)
    rds = load_dataset(ref.root, validity=opts.validity)
    nds = load_dataset(new.root, validity=opts.validity)
    notes = [n for n in [align_configs(rds, nds)] if n]
    notes += aggregates_notes(rds, nds)
    ra, na = analyse(rds, opts), analyse(nds, opts)
    host = compare_hosts(ref.provenance, new.provenance)
    prov = provenance_diff(ref, new, host)
    gate = crossrun_gate(ref, new, opts)
    ratio, speed = host_speed_record(ref, new, gate)
    points = point_rows(ra, na, s)
    tests = attribute_points(points, ra, na, opts, ratio, gate)
    pairs = pair_rows(ra, na, s)
    claims_checked = claim_rows(ra, na, opts, claims)
    judged = (
        [p["verdict"] for p in pairs if p["verdict"]]
        + [c["verdict"] for c in claims_checked]
        + [p["verdict"] for p in points if p["verdict"]]
    )
    overall, why = _overall(prov["blocking"], judged)
    if prov["blocking"]:
        for row in claims_checked:
            row["as_measured"] = row["verdict"]
            row["verdict"] = NOT_COMPARABLE
    checked: list[Mapping[str, object]] = [*pairs, *claims_checked, *points]
    failed = [c for c in checked if c.get("judged", True) and c["verdict"] == NOT_REPRODUCED]
    settings: ReproductionSettings = {
        # as floats: a config may write them as integers (the schema's default is 0)
        "metrics": list(s.metrics),
        "min_effect_pct": float(s.min_effect_pct),
        "require_significance": s.require_significance,
        "tolerance_pct": None if s.tolerance_pct is None else float(s.tolerance_pct),
        "tolerance_metrics": list(s.tolerance_metrics),
        "threshold_pct": opts.threshold_pct,
        "alpha": opts.alpha,
    }
    if ra.g.open_loop:  # a sweep over request rates (a concurrency sweep's record stays as it was)
        settings["axis"] = "rate"
    return {
        "format_version": FORMAT_VERSION,
        "verdict": overall,
        "verdict_text": _qualified(overall, host) + _attributed(overall, host, speed, failed),
        "why": why,
        "host": host,
        "host_speed": speed,
        "fdr": {"method": "Benjamini-Hochberg", "q": FDR_Q, "tests": tests},
        "reference": ref.describe(),
        "fresh": new.describe(),
        "settings": settings,
        "notes": notes,
        "claims": claims_checked,
        "orderings": [p for p in pairs if p["judged"]],
        "chains": chain_rows(ra, na),
        "paired": pairs,
        "points": points,
        "provenance": prov,
        "counts": {
            "checks": len(judged),
            "reproduced": judged.count(REPRODUCED),
            "not_reproduced": judged.count(NOT_REPRODUCED),
            "not_comparable": judged.count(NOT_COMPARABLE),
        },
    }


def _qualified(verdict: str, host: HostComparison) -> str:
    """The verdict with the host it was reached on; one on a differing host names the
    differences (NOT COMPARABLE stays bare)."""
    if verdict == NOT_COMPARABLE:
        return verdict
    return f"{verdict} {host['qualifier']}"


def crossrun_gate(ref: Side, new: Side, opts: AnalysisSection) -> Gate:
    """The gate a fresh run's changes pass against the reference's host speed: the margin of
    the reference's analysis options (analysis.equivalence's default where they hold none),
    and the rerun that settles an UNKNOWN: the reference against the fresh bundle."""
    margin = getattr(opts, "margin_pct", None) or DEFAULT_MARGIN_PCT
    rerun = rerun_command(ref.given, new.given)
    return Gate(float(margin), rerun=rerun, names=("the reference", "the fresh run"))


def host_speed_record(
    ref: Side, new: Side, gate: Gate | None = None
) -> tuple[HostRatio | None, HostSpeedRecord]:
    """The host-speed ratio of the fresh run to the reference (their canaries in raw/<sc>/
    run.json; above 1: the fresh host is faster) with its interval, or why there is none; and
    its record."""
    speeds: list[HostSpeed | None] = []
    errors = []
    for side in (ref, new):
        try:
            speeds.append(read_host_speed(side.root))
        except ServelabError as exc:  # a damaged canary: that side's host speed is unknown
            speeds.append(None)
            errors.append(str(exc).replace(str(side.root), side.given))
    before, after = speeds
    why = "; ".join(errors) or why_no_ratio(before, after, ("the reference", "the fresh run"))
    ratio = None if errors else host_ratio(before, after)
    return ratio, host_speed_json(ratio, why, gate)


def _attributed(
    verdict: str,
    host: HostComparison,
    speed: HostSpeedRecord,
    failed: list[Mapping[str, object]],
) -> str:
    """What a failure on an equivalent or identical host says of the code. A regression only
    where the host's speed is recorded on both sides and explains no failed check: an
    ordering or claim while the host's speed did not move and the canary's gate let it be
    read, a point whose change is beyond what the host explains and worse; where the canary
    cannot tell, not attributed, with the rerun that settles it; otherwise not attributed to
    the code, with why."""
    if verdict != NOT_REPRODUCED or host["class"] not in ("equivalent", "identical"):
        return ""
    if not speed.get("recorded"):
        why = str(speed.get("why_not") or HOST_NOT_RECORDED)
        return f": not attributed to the code ({why})"
    moved = bool(speed.get("moved"))
    gated = speed.get("unknown_why")  # the canary cannot tell before any point is read
    code = [
        c
        for c in failed
        if ("host_attribution" not in c and not moved and not gated)
        or c.get("host_attribution") == BEYOND_HOST
    ]
    times = f"x{float(speed['ratio']):.3g} of the reference's"
    unknown = [
        c
        for c in failed
        if c.get("host_attribution") == UNKNOWN or ("host_attribution" not in c and gated)
    ]
    if not code and unknown:
        why = str(gated or unknown[0].get("host_why") or "").split("; compare both")[0]
        rerun = speed.get("rerun") or rerun_command()
        return (
            f": not attributed to the code (the canary cannot tell for {len(unknown)} failed "
            f"check{'s' * (len(unknown) != 1)}: {why}; compare both on one host: `{rerun}`)"
        )
    if not code and moved:
        return f": not attributed to the code (the host's speed, {times}, explains every failure)"
    if not code:
        return (
            ": not attributed to the code (no failed check is a real change beyond the host's "
            f"speed, {times})"
        )
    if all(c.get("direction") == "better" for c in code):
        return f": faster beyond what the host's speed ({times}) explains, not a regression"
    return ": a regression" + (f" beyond what the host's speed ({times}) explains" if moved else "")


def compare(
    ref_path: Path,
    new_path: Path,
    settings: ReproductionSection | None = None,
    out: Path | None = None,
) -> ReproductionRecord:
    """Open (and verify) both sides, compare, and write reproduction.json and report.md.
    `settings`: how strictly the fresh run must match (None: the schema's defaults)."""
    s = settings or default_section(ReproductionSection, "reproduction")
    with tempfile.TemporaryDirectory(prefix="servelab-compare-") as tmp:
        ref = open_side(ref_path, Path(tmp) / "reference", "reference")
        new = open_side(new_path, Path(tmp) / "fresh", "fresh run")
        result = compare_sides(ref, new, s)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "reproduction.json", result)
        validate_file(out / "reproduction.json", "reproduction", "reproduction.json")
        (out / "report.md").write_text(report_markdown(result), encoding="utf-8")
    return result


def reproduce_experiment(exp: Experiment, paths: ExperimentPaths) -> ReproductionRecord:
    """The workflow's stage: compare the experiment's fresh bundle with its `reference:`, as
    its `reproduction:` section says; write reproduction.json and report.md."""
    if exp.reference is None:
        raise ServelabError("no reference to compare with: set `reference:` (docs/reproduce.md)")
    return compare(Path(exp.reference), paths.bundle, exp.reproduction, paths.reproduction)


def _config_dataset(ref: DatasetFacts | None, spec: Mapping[str, object] | None) -> str | None:
    """Why the dataset a config names (workload.dataset) is not the reference's, in one line;
    None when it is (the same sha256, or the same hub file and revision), or both are
    synthetic."""
    if not ref and not spec:
        return None
    f = _fields(ref.get("file")) if ref else {}
    hub = _fields((spec or {}).get("hub"))
    pinned = (spec or {}).get("sha256")
    keys = ("repo_id", "filename", "revision")
    if ref and spec:
        if pinned == f.get("sha256") if pinned else all(hub.get(k) == f.get(k) for k in keys):
            return None
    mine = "synthetic prompts"
    if spec:
        name = spec.get("path") or f"{hub.get('repo_id')}/{hub.get('filename')}"
        mine = f"dataset {name}" + (f" (sha256 {str(pinned)[:12]})" if pinned else "")
    return (
        f"the reference was measured on {_dataset_text(ref)}, this config samples {mine}: a "
        "reproduction on another dataset is not compared; pin the reference's dataset in "
        "workload.dataset"
    )


def _config_trace(
    ref: Mapping[str, object] | None, spec: Mapping[str, object] | None
) -> str | None:
    """Why the trace window a config replays (workload.trace) is not the reference's, in one
    line; None when it is (the pinned sha256, or the hub file, the window's start and
    duration, or the busiest window of its length, and the fit to the server), or neither
    replays a trace."""
    if not ref and not spec:
        return None
    f, w = _fields((ref or {}).get("file")), _fields((ref or {}).get("window"))
    if ref and spec:
        hub, pinned = _fields(spec.get("hub")), spec.get("sha256")
        keys = ("repo_id", "filename", "revision")
        same = pinned == f.get("sha256") if pinned else all(hub.get(k) == f.get(k) for k in keys)
        busiest = spec.get("busiest")
        if busiest is not None:  # the same file's busiest window of that length
            window_same = busiest == w.get("duration_s")
        else:
            start, duration = _start_s(spec), spec.get("duration_s")
            window_same = start == w.get("start_s") and duration in (None, w.get("duration_s"))
        fit = tuple(spec.get(k, v) for k, v in FIT_KEYS.items())
        if same and window_same and fit == _fit_of(w):
            return None
    mine = "no trace"
    if spec:
        hub = _fields(spec.get("hub"))
        name = spec.get("path") or f"{hub.get('repo_id')}/{hub.get('filename')}"
        span = (
            f"the busiest {spec['busiest']} s"
            if spec.get("busiest") is not None
            else f"{_start_s(spec)} s + {spec.get('duration_s')} s"
        )
        fit_text = _fit_text(tuple(spec.get(k, v) for k, v in FIT_KEYS.items()))
        mine = f"trace {name} (sha256 {str(spec.get('sha256'))[:12]}, window {span}{fit_text})"
    return (
        f"the reference replayed {_trace_text(ref)}, this config replays {mine}: a "
        "reproduction on another trace, window or fit is not compared; pin the reference's "
        "trace, window and fit in workload.trace"
    )


def _spec(workload: Mapping[str, object], key: str) -> Mapping[str, object] | None:
    """The config's workload.dataset or workload.trace; None where it sets none."""
    spec = workload.get(key)
    return spec if isinstance(spec, Mapping) else None


def _start_s(spec: Mapping[str, object]) -> float:
    """workload.trace.start_s: where the replayed window starts (0 where unset)."""
    start = spec.get("start_s", 0)
    if not isinstance(start, int | float | str):
        raise ServelabError(f"workload.trace.start_s: {start!r} is not a number of seconds")
    return float(start)


def reference_orderings(path: Path, s: ReproductionSection) -> list[str]:
    """The orderings a reproduction against the reference at `path` judges, as comparison
    claims (checks.ordering_claims), the reference analysed with its own options."""
    with tempfile.TemporaryDirectory(prefix="servelab-reference-") as tmp:
        side = open_side(path, Path(tmp), "reference")
        opts = side.analysis
        return ordering_claims(analyse(load_dataset(side.root, validity=opts.validity), opts), s)


def check_reference(path: Path, workload: Mapping[str, object] | None = None) -> str:
    """Open and verify a reference (for the workflow's start); one line describing it. With
    the experiment's resolved `workload`, a reference measured on another dataset (or on
    synthetic prompts where this config samples a dataset, or the reverse) is refused."""
    with tempfile.TemporaryDirectory(prefix="servelab-reference-") as tmp:
        side = open_side(path, Path(tmp), "reference")
        if workload is not None and side.provenance is not None:
            why = _config_dataset(side.provenance.get("dataset"), _spec(workload, "dataset"))
            why = why or _config_trace(side.provenance.get("trace"), _spec(workload, "trace"))
            if why is not None:
                raise ServelabError(f"{path}: {why}")
        if side.kind in ("experiment", "vllm-bench"):
            raise ServelabError(
                f"{path}: reference must be a release folder, its .tar.gz or a bundle folder "
                f"(this is {'a vllm-bench tree' if side.kind == 'vllm-bench' else 'raw results'}: "
                "compare those with `servelab compare`)"
            )
        d = side.describe()
        claims = len(side.analysis.claims)
    tag = f" tag {d['tag']}," if d.get("tag") else ""
    return f"{path} verified ({d['kind']},{tag} experiment {d.get('experiment')}, {claims} claims)"
