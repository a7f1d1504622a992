"""Diagnoses (diagnoses.json): what the tables say about the server's configuration, in
plain words with the evidence - serialized, KV headroom unused, a throughput dip, utilization
that misleads, points past the knee and dominated points.

Every diagnosis carries its evidence level (`evidence_level`, stats.evidence_level): how many
repeats it rests on and whether a paired test called it real. On one repeat a diagnosis says
what the data show, labelled "1 repeat: not tested", rather than being dropped."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from servelab.analysis.dataset import Capacity, Dataset
from servelab.analysis.diagnosis_records import CaptureFit, Dip, FlatSpan, UtilizationHit, level_of
from servelab.analysis.groups import Groups
from servelab.analysis.knee import DOMINANCE, DominanceRow, dominance_levels, knee_level
from servelab.analysis.proposals import launched, max_num_seqs, not_launched, with_proposal
from servelab.analysis.stats import evidence_level, paired
from servelab.design.level import LevelValue
from servelab.documents.declared import Diagnosis, EvidenceLevel, Knee
from servelab.experiment import AnalysisSection
from servelab.launch.serverlog import parse_capture_sizes

LINEAR_TOLERANCE = 1.25  # serialized: seconds per request may vary this much across levels


def _at_level(d: Diagnosis, axis: str, level: int | float | list[int] | list[float]) -> Diagnosis:
    """The diagnosis with its level on `axis` ("concurrency" or "rate")."""
    if axis == "rate":
        d["rate"] = [x for x in level] if isinstance(level, list) else level
    else:  # a concurrency is a whole number
        d["concurrency"] = [int(x) for x in level] if isinstance(level, list) else int(level)
    return d


def _repeats(g: Groups, sc: str, levels: Sequence[LevelValue], metrics: list[str]) -> int:
    """The fewest repeats a statistic over these levels and metrics rests on."""
    return min((len(g.values(sc, c, m)) for c in levels for m in metrics), default=0)


def diagnosis_line(d: Diagnosis) -> str:
    """One diagnosis as `servelab analyze` prints it: kind, config, concurrency, evidence
    level, and for a dip what the CUDA graph capture sizes say."""
    axis, key = ("rate", "rate=") if "rate" in d else ("concurrency", "c=")
    at = level_of(d, axis)
    where = f" {key}{at}" if at is not None else ""
    if d["kind"] == "dominated":
        where += f" by {key}{cast(DominanceRow, d['evidence'])['dominated_by']}"
    text = f"{d['kind']}: {d['server_config']}{where} ({d['evidence_level']['label']})"
    if d.get("capture_explanation"):
        text += f"; {d['capture_explanation']}"
    return text


@dataclass(frozen=True)
class _Config:
    """One server config as the per-config checks read it: the levels with a throughput
    mean, those means, what capacity.json says of it, and the analysis options."""

    g: Groups
    sc: str
    cap: Capacity  # capacity.json
    levels: list[int]
    means: dict[int, float]
    analysis: AnalysisSection


def _serialized(v: _Config) -> list[Diagnosis]:
    """Throughput flat and wall time linear in the requests over a 4x span of concurrency:
    the server handles one request at a time."""
    flat = _flat_span(v.g, v.sc, v.levels, v.means, v.analysis)
    if flat is None:
        return []
    lo, hi = flat["concurrency_span"]
    span = [c for c in v.levels if lo <= c <= hi]
    mns = max_num_seqs(v.cap)
    return [
        {
            "kind": "serialized",
            "server_config": v.sc,
            "evidence": {**flat, "max_num_seqs": mns},
            "evidence_level": evidence_level(
                _repeats(v.g, v.sc, span, ["output_throughput", "duration", "num_prompts"])
            ),
            "suggestion": (
                "the server handles one request at a time: throughput is flat and wall "
                "time grows linearly with the number of requests; "
                + (
                    f"--max-num-seqs is {mns}: raise it"
                    if mns is not None
                    else "check --max-num-seqs and the scheduler limits"
                    + ("" if launched(v.cap) else f" ({not_launched('--max-num-seqs')})")
                )
            ),
        }
    ]


def _kv_headroom_unused(v: _Config) -> list[Diagnosis]:
    """--max-num-seqs below the sequences the startup log says the KV cache fits."""
    mns = max_num_seqs(v.cap)
    maxconc = v.cap.get("max_concurrency")
    if mns is None or not isinstance(maxconc, int | float) or mns >= math.floor(maxconc):
        return []
    return [
        {
            "kind": "kv_headroom_unused",
            "server_config": v.sc,
            "evidence": {
                "max_num_seqs": mns,
                "max_concurrency": maxconc,
                "tokens_per_request": v.cap.get("max_concurrency_tokens_per_request"),
                "kv_cache_tokens": v.cap.get("kv_cache_tokens"),
            },
            "suggested_max_num_seqs": math.floor(maxconc),
            "evidence_level": evidence_level(None),
            "suggestion": (
                f"the startup log says the KV cache fits {maxconc:g} sequences of "
                f"{v.cap.get('max_concurrency_tokens_per_request')} tokens, but "
                f"--max-num-seqs is {mns}; try --max-num-seqs {math.floor(maxconc)}"
            ),
        }
    ]


def _non_monotonic(v: _Config) -> list[Diagnosis]:
    """A throughput dip (_dip) with what the CUDA graph capture sizes say of it."""
    found = _dip(v.g, v.sc, v.levels, v.analysis)
    if found is None:
        return []
    dip, level = found
    fit = _capture_fit(v.g, v.sc, v.cap, dip["concurrency"], dip["lower_concurrency"])
    return [
        {
            "kind": "non_monotonic",
            "server_config": v.sc,
            "concurrency": dip["concurrency"],
            "capture_sizes": fit["capture_sizes"],
            "capture_sizes_source": fit["capture_sizes_source"],
            "cudagraph_mode": fit["cudagraph_mode"],
            "batch_size": fit["batch_size"],
            "batch_size_source": fit["batch_size_source"],
            "outside_capture_sizes": fit["outside_capture_sizes"],
            "capture_explanation": fit["capture_explanation"],
            "evidence": dip,
            "evidence_level": level,
            "suggestion": (
                f"throughput dips {dip['drop_pct']:.0f}% below concurrency "
                f"{dip['lower_concurrency']} here and recovers at higher concurrency: "
                "avoid this operating point; " + fit["capture_explanation"]
            ),
        }
    ]


def _utilization_misleading(v: _Config) -> list[Diagnosis]:
    """Utilization >= 95% at points delivering under half the best throughput (needs telemetry)."""
    best = max(v.means.values(), default=0.0)
    hits: list[UtilizationHit] = []
    for c in v.levels:
        utils = [float(u) for u in v.g.values(v.sc, c, "utilization_pct").values()]
        if utils and min(utils) >= 95.0 and best > 0 and v.means[c] < 0.5 * best:
            hits.append(
                {
                    "concurrency": c,
                    "utilization_pct": min(utils),
                    "output_throughput": v.means[c],
                    "best_throughput": best,
                }
            )
    if not hits:
        return []
    return [
        {
            "kind": "utilization_misleading",
            "server_config": v.sc,
            "concurrency": [h["concurrency"] for h in hits],
            "evidence": hits,
            "evidence_level": evidence_level(
                _repeats(
                    v.g,
                    v.sc,
                    [int(h["concurrency"]) for h in hits],
                    ["output_throughput", "utilization_pct"],
                )
            ),
            "suggestion": "the device reads fully busy while delivering under half the best "
            "throughput: judge by tokens/s, not utilization",
        }
    ]


# the checks of one server config, in the order diagnoses.json lists what they find
CONFIG_CHECKS: tuple[Callable[[_Config], list[Diagnosis]], ...] = (
    _serialized,
    _kv_headroom_unused,
    _non_monotonic,
    _utilization_misleading,
)


def _past_knee(g: Groups, knees: list[Knee]) -> list[Diagnosis]:
    """The levels above each config's knee: they add latency, not throughput."""
    out: list[Diagnosis] = []
    axis = g.axis
    word = "a request rate" if g.open_loop else "concurrency"
    for k in knees:
        at = knee_level(k, axis)
        if at is None:
            continue
        past = [c for c in g.levels(k["server_config"]) if c > at]
        if past:
            d: Diagnosis = {
                "kind": "past_knee",
                "server_config": k["server_config"],
                "evidence": {"knee": at, "reason": k["reason"]},
                "evidence_level": k["evidence_level"],
                "suggestion": f"{word} above {at} adds latency, not throughput",
            }
            out.append(_at_level(d, axis, past))
    return out


def _dominated(g: Groups, dominated: list[DominanceRow]) -> list[Diagnosis]:
    """Each dominated point (knee.dominance), with the repeats its comparison rests on."""
    word = "request rate" if g.open_loop else "concurrency"
    return [_dominated_one(g, d, word) for d in dominated]


def _dominated_one(g: Groups, d: DominanceRow, word: str) -> Diagnosis:
    """One dominated point (a row of knee.dominance) as a diagnosis."""
    axis = g.axis
    sc, (at, by) = str(d["server_config"]), dominance_levels(d, axis)
    out: Diagnosis = {
        "kind": "dominated",
        "server_config": sc,
        "evidence": d,
        # the repeats of the metrics compared (a p99 too few requests report is not)
        "evidence_level": evidence_level(_repeats(g, sc, [at, by], _compared(d))),
        "suggestion": (
            f"{word} {by} is at least as good on throughput, TTFT and TPOT: do not operate here"
        ),
    }
    return _at_level(out, axis, at)


def _compared(d: DominanceRow) -> list[str]:
    """The DOMINANCE metrics a dominance row compared: those with a delta."""
    return [m for m, _ in DOMINANCE if d.get(f"{m}_delta_pct") is not None]


def diagnoses(
    g: Groups,
    ds: Dataset,
    knees: list[Knee],
    dominated: list[DominanceRow],
    analysis: AnalysisSection,
) -> list[Diagnosis]:
    """Every diagnosis: per server config what each of CONFIG_CHECKS finds, then the levels
    past each knee, then the dominated points; each with its `proposal` or `no_remedy`
    (analysis.proposals)."""
    out: list[Diagnosis] = []
    # what they read (flat throughput over a span of concurrency, requests in flight against
    # the KV cache's room) is a closed loop's: an open loop's levels are rates
    for sc in [] if g.open_loop else g.configs:
        lv = [int(c) for c in g.levels(sc) if g.mean(sc, c, "output_throughput") is not None]
        means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
        view = _Config(g, sc, ds.capacity.get(sc, {}), lv, means, analysis)
        for check in CONFIG_CHECKS:
            out += check(view)
    out += _past_knee(g, knees) + _dominated(g, dominated)
    # each with the change it proposes (analysis.proposals), or why there is none
    return [with_proposal(d, ds.capacity.get(d["server_config"], {}), g) for d in out]


def _flat_span(
    g: Groups, sc: str, lv: list[int], means: dict[int, float], analysis: AnalysisSection
) -> FlatSpan | None:
    """The widest run of consecutive levels spanning at least 4x in concurrency over which
    throughput varies less than flat_pct and seconds per request (duration / prompts) stay
    within LINEAR_TOLERANCE, i.e. wall time grows linearly with the number of requests."""
    best: FlatSpan | None = None
    for i in range(len(lv)):
        for j in range(len(lv) - 1, i, -1):
            span = lv[i : j + 1]
            if span[-1] / span[0] < 4:
                break
            tp = [means[c] for c in span]
            if min(tp) <= 0:
                continue
            spread = 100.0 * (max(tp) / min(tp) - 1)
            s_per_req = {
                c: (g.mean(sc, c, "duration") or 0.0)
                / max(1.0, g.mean(sc, c, "num_prompts") or 1.0)
                for c in span
            }
            lo, hi = min(s_per_req.values()), max(s_per_req.values())
            if spread < analysis.flat_pct and lo > 0 and hi / lo <= LINEAR_TOLERANCE:
                if (
                    best is None
                    or span[-1] / span[0]
                    > best["concurrency_span"][1] / best["concurrency_span"][0]
                ):
                    best = {
                        "throughput_spread_pct": spread,
                        "concurrency_span": [span[0], span[-1]],
                        "seconds_per_request": s_per_req,
                    }
                break
    return best


def _dip(
    g: Groups, sc: str, lv: list[int], analysis: AnalysisSection
) -> tuple[Dip, EvidenceLevel] | None:
    """The first level whose throughput is below a lower level's and a higher level's by
    `threshold_pct`: with repeats, when the paired test calls the drop from the best lower
    level real; on one repeat, as seen (untested). Returns the evidence and its level."""
    means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
    for i, c in enumerate(lv):
        lower = [d for d in lv[:i] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)]
        higher = [
            d for d in lv[i + 1 :] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)
        ]
        if not (lower and higher):
            continue
        ref = max(lower, key=lambda d: means[d])
        va, vb = g.pair(sc, ref, sc, c, "output_throughput")
        test = paired(va, vb, analysis.threshold_pct, analysis.alpha)
        if test.verdict == "a > b":
            level = evidence_level(test.n, test)
        elif test.n == 1:
            level = evidence_level(1)
        else:
            continue
        return (
            {
                "concurrency": c,
                "throughput": means[c],
                "lower_concurrency": ref,
                "lower_throughput": means[ref],
                "drop_pct": 100.0 * (1 - means[c] / means[ref]),
                "recovers_at": higher[0],
                "passes_lower_at": next((d for d in higher if means[d] > means[ref]), None),
                "agree": test.agree,
                "p_value": test.p_value,
            },
            level,
        )
    return None


def _capture_sizes(cap: Capacity) -> tuple[list[int] | None, str | None]:
    """The capture sizes capacity.json records; for one written before it recorded them, what
    the non-default arguments asked for."""
    if "cudagraph_capture_sizes" in cap:
        return cap["cudagraph_capture_sizes"], cap.get("cudagraph_capture_sizes_source")
    found = parse_capture_sizes("", cap.get("non_default_args") or {})
    return found["cudagraph_capture_sizes"], found["cudagraph_capture_sizes_source"]


def _batch(g: Groups, sc: str, c: int, mns: int | None) -> tuple[int, str]:
    """The batch a level ran at: the steady number of running requests when telemetry has it
    (their 95th percentile over the point, mean over repeats), else the concurrency, capped by
    --max-num-seqs."""
    steady = g.mean(sc, c, "running_p95")
    if steady is not None and steady > 0:
        return int(round(steady)), "steady batch (running requests, telemetry)"
    if mns is not None and mns < c:
        return mns, "max_num_seqs"
    return c, "concurrency"


def _capture_fit(g: Groups, sc: str, cap: Capacity, c: int, ref: int) -> CaptureFit:
    """Whether the dip's batch size is outside the CUDA graphs the server captured, in words
    (`capture_explanation`) and as `outside_capture_sizes` (None when the log does not say)."""
    sizes, source = _capture_sizes(cap)
    mode = cap.get("cudagraph_mode")
    mns = max_num_seqs(cap)
    batch, batch_source = _batch(g, sc, c, mns)
    ref_batch, _ = _batch(g, sc, ref, mns)
    outside: bool | None = None
    if sizes is None and not launched(cap):
        text = (
            "the CUDA graph capture sizes are unknown (servelab did not launch this server: "
            "no startup log): a batch size outside the captured graphs is a common cause on GPUs"
        )
    elif sizes is None:
        text = (
            "the CUDA graph capture sizes are unknown (no compilation config in the startup "
            "log): a batch size outside the captured graphs is a common cause on GPUs"
        )
    elif not sizes or mode == "NONE":
        text = "the server captured no CUDA graphs: capture sizes do not explain the dip"
    elif batch > max(sizes):
        outside = True
        where = "inside them" if ref_batch <= max(sizes) else "outside them too"
        text = (
            f"batch size {batch} (the {batch_source.split(' (')[0]}) is outside the captured CUDA "
            f"graph sizes {sizes}: it runs without a captured graph, while concurrency {ref} "
            f"(batch {ref_batch}) is {where}"
        )
    elif batch in sizes:
        outside = False
        text = (
            f"batch size {batch} is a captured CUDA graph size ({sizes}): capture sizes do "
            "not explain the dip"
        )
    else:
        outside = False
        up = min(x for x in sizes if x > batch)
        text = (
            f"batch size {batch} is not a captured CUDA graph size but is padded up to {up} "
            f"(captured: {sizes}): padding, not a missing graph"
        )
    return {
        "capture_sizes": sizes,
        "capture_sizes_source": source,
        "cudagraph_mode": mode,
        "batch_size": batch,
        "batch_size_source": batch_source,
        "outside_capture_sizes": outside,
        "capture_explanation": text,
    }
