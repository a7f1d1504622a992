"""Tables and verdicts: pure functions of a loaded Dataset (see docs/analysis.md)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import fields
from typing import Any

from servelab.analysis.claims_syntax import CMP as _CMP
from servelab.analysis.claims_syntax import FUNC as _FUNC
from servelab.analysis.claims_syntax import parse_claim
from servelab.analysis.load import Dataset, Point
from servelab.analysis.stats import describe, paired
from servelab.analysis.validity import BY_NAME, CHECKS, Flag, PointFlags, failed
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection, SloSection

POINT_METRICS = (
    [
        "num_prompts",
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
    ]
    + [
        f"{stat}_{lat}_ms"
        for lat in ("ttft", "tpot", "itl", "e2el", "ttfb", "client_wait")
        for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")
    ]
    + ["achieved_concurrency", "mean_in_flight", "client_cpu_s"]
)

SUMMARY_METRICS = [
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "duration",
]
PAIRED_METRICS = ["output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms"]
# throughput: higher is better; latencies: lower is better
DOMINANCE = [
    ("output_throughput", 1),
    ("mean_ttft_ms", -1),
    ("p99_ttft_ms", -1),
    ("mean_tpot_ms", -1),
    ("p99_tpot_ms", -1),
]
ALIASES = {"throughput": "output_throughput", "tput": "output_throughput"}
LINEAR_TOLERANCE = 1.25  # serialized: seconds per request may vary this much across levels
INVALID_SHOWN = 3  # points named in an "invalid: ..." text before "and N more"
# what each kind of claim reads, besides the metric a comparison names
CLAIM_READS = {
    "dominated": [m for m, _ in DOMINANCE],
    "past_knee": ["output_throughput", "p99_ttft_ms"],
    "knee": ["output_throughput", "p99_ttft_ms"],
    "serialized": ["output_throughput", "duration", "num_prompts"],
}


class Groups:
    """Points indexed by (server_config, concurrency) -> {repeat: Point}.

    `values` is what every statistic reads: a metric of a point that failed a validity check
    affecting it is left out there (and so out of means, tests, knee, dominance, SLO, diagnoses
    and claims); `left_out` says which and why.
    """

    def __init__(self, ds: Dataset) -> None:
        self.by: dict[tuple[str, int], dict[int, Point]] = defaultdict(dict)
        for p in ds.points:
            self.by[(p.server_config, p.concurrency)][p.repeat] = p
        self.configs = ds.configs()
        self.thresholds = ds.validity

    def levels(self, sc: str) -> list[int]:
        return sorted(c for (s, c) in self.by if s == sc)

    def values(self, sc: str, c: int, metric: str) -> dict[int, float]:
        return {
            r: p.metrics[metric]
            for r, p in self.by.get((sc, c), {}).items()
            if p.metrics.get(metric) is not None and not p.left_out(metric)
        }

    def valid_points(self, sc: str, c: int, metric: str) -> list[Point]:
        """The repeats of a point whose `metric` counts, by repeat."""
        reps = self.by.get((sc, c), {})
        return [reps[r] for r in sorted(reps) if not reps[r].left_out(metric)]

    def left_out(self, sc: str, c: int, metric: str) -> list[tuple[Point, Flag]]:
        reps = self.by.get((sc, c), {})
        return [(reps[r], f) for r in sorted(reps) for f in reps[r].left_out(metric)]

    def point_flags(self) -> list[PointFlags]:
        return [
            (sc, r, c, p.checks)
            for (sc, c), reps in sorted(self.by.items())
            for r, p in sorted(reps.items())
        ]

    def mean(self, sc: str, c: int, metric: str) -> float | None:
        return describe(list(self.values(sc, c, metric).values())).mean

    def pair(
        self, sc_a: str, a: int, sc_b: str, b: int, metric: str
    ) -> tuple[list[float], list[float]]:
        va, vb = self.values(sc_a, a, metric), self.values(sc_b, b, metric)
        reps = sorted(set(va) & set(vb))
        return [va[r] for r in reps], [vb[r] for r in reps]


# --- tables ------------------------------------------------------------------------------


def points_table(ds: Dataset) -> list[dict[str, Any]]:
    rows = []
    for p in sorted(ds.points, key=lambda p: (p.server_config, p.concurrency, p.repeat)):
        row: dict[str, Any] = {
            "server_config": p.server_config,
            "repeat": p.repeat,
            "concurrency": p.concurrency,
            "position": p.position,
            "valid": p.valid,
            "invalid_reasons": "; ".join(f"{f.check}: {f.reason}" for f in failed(p.checks)),
        }
        row.update({m: p.metrics.get(m) for m in POINT_METRICS})
        rows.append(row)
    return rows


def summary_table(g: Groups) -> list[dict[str, Any]]:
    rows = []
    for sc in g.configs:
        for c in g.levels(sc):
            for m in SUMMARY_METRICS:
                d = describe(list(g.values(sc, c, m).values()))
                rows.append(
                    {
                        "server_config": sc,
                        "concurrency": c,
                        "metric": m,
                        "n": d.n,
                        "mean": d.mean,
                        "sd": d.sd,
                        "cv_pct": d.cv_pct,
                        "ci95_low": d.ci95_low,
                        "ci95_high": d.ci95_high,
                        "min": d.min,
                        "max": d.max,
                    }
                )
    return rows


def _pair_specs(g: Groups, analysis: AnalysisSection) -> list[tuple[str, int, int]]:
    specs = []
    for sc in g.configs:
        lv = g.levels(sc)
        specs += [(sc, a, b) for a, b in zip(lv, lv[1:], strict=False)]
    for i, spec in enumerate(analysis.pairs):
        a, b = spec.a, spec.b
        for sc in [spec.server_config] if spec.server_config else g.configs:
            if sc not in g.configs:
                raise ServelabError(f"analysis.pairs[{i}].server_config: {sc!r} is not measured")
            if a in g.levels(sc) and b in g.levels(sc) and (sc, a, b) not in specs:
                specs.append((sc, a, b))
    return specs


def paired_table(g: Groups, analysis: AnalysisSection) -> list[dict[str, Any]]:
    rows = []
    for sc, a, b in _pair_specs(g, analysis):
        for m in PAIRED_METRICS:
            va, vb = g.pair(sc, a, sc, b, m)
            r = paired(va, vb, analysis.threshold_pct, analysis.alpha)
            hits = g.left_out(sc, a, m) + g.left_out(sc, b, m)
            rows.append(
                {
                    "server_config": sc,
                    "a": a,
                    "b": b,
                    "metric": m,
                    "n": r.n,
                    "mean_rel_diff_pct": r.mean_rel_diff_pct,
                    "agree": r.agree,
                    # no test on the repeats that remain: say why one is missing
                    "p_value": None if hits else r.p_value,
                    "verdict": invalid_text(hits) if hits else r.verdict,
                }
            )
    return rows


# --- knee, dominance, SLO ------------------------------------------------------------------


def knee(g: Groups, analysis: AnalysisSection) -> list[dict[str, Any]]:
    out = []
    for sc in g.configs:
        lv = g.levels(sc)
        means = {c: g.mean(sc, c, "output_throughput") for c in lv}
        p99 = {c: g.mean(sc, c, "p99_ttft_ms") for c in lv}
        entry: dict[str, Any] = {
            "server_config": sc,
            "concurrency": None,
            "reason": "",
            "evidence": {},
        }
        usable = [c for c in lv if means[c] is not None]
        if len(usable) < 2:
            entry["reason"] = "fewer than two concurrency levels with throughput"
            out.append(entry)
            continue
        best = max(usable, key=lambda c: (means[c], -c))
        after = [c for c in usable if c > best]
        if after:
            nxt = after[0]
            va, vb = g.pair(sc, best, sc, nxt, "output_throughput")
            if va and all(x > y for x, y in zip(va, vb, strict=True)):
                entry.update(
                    concurrency=best,
                    reason=(
                        f"throughput peaks at {best} and falls at {nxt} in every repeat "
                        f"({len(va)}/{len(va)})"
                    ),
                )
                entry["evidence"] = {
                    "peak_throughput": means[best],
                    "next_concurrency": nxt,
                    "next_throughput": means[nxt],
                    "change_pct": 100.0 * (means[nxt] / means[best] - 1),  # type: ignore[operator]
                    "repeats_falling": f"{len(va)}/{len(va)}",
                }
                out.append(entry)
                continue
        # plateau: the first level that no later level beats by the plateau margin,
        # provided latency grows past it
        for i, lo in enumerate(usable[:-1]):
            hi = usable[i + 1]
            later_best = max(means[c] for c in usable[i + 1 :])  # type: ignore[type-var]
            gain = 100.0 * (later_best / means[lo] - 1) if means[lo] else math.inf  # type: ignore[operator]
            grows = p99[hi] is not None and p99[lo] is not None and p99[hi] > p99[lo]  # type: ignore[operator]
            if gain < analysis.plateau_pct and grows:
                entry.update(
                    concurrency=lo,
                    reason=(
                        f"throughput stops rising after {lo} (no higher concurrency gains "
                        f"{analysis.plateau_pct:g}% or more; best later {gain:+.1f}%) "
                        "while p99 TTFT grows"
                    ),
                )
                entry["evidence"] = {
                    "throughput": means[lo],
                    "best_later_gain_pct": gain,
                    "next_concurrency": hi,
                    "p99_ttft_ms": p99[lo],
                    "next_p99_ttft_ms": p99[hi],
                }
                break
        else:
            entry["reason"] = (
                f"no knee: throughput still rises up to the highest concurrency "
                f"measured ({usable[-1]})"
            )
        out.append(entry)
    return out


def dominance(g: Groups) -> list[dict[str, Any]]:
    rows = []
    for sc in g.configs:
        lv = g.levels(sc)
        vals = {c: {m: g.mean(sc, c, m) for m, _ in DOMINANCE} for c in lv}
        for c in lv:
            for d in lv:
                if c == d or any(v is None for v in (*vals[c].values(), *vals[d].values())):
                    continue
                better_eq = all(sign * (vals[d][m] - vals[c][m]) >= 0 for m, sign in DOMINANCE)  # type: ignore[operator]
                strictly = any(sign * (vals[d][m] - vals[c][m]) > 0 for m, sign in DOMINANCE)  # type: ignore[operator]
                if better_eq and strictly:
                    row: dict[str, Any] = {"server_config": sc, "concurrency": c, "dominated_by": d}
                    for m, _ in DOMINANCE:
                        row[f"{m}_delta_pct"] = _pct(vals[c][m], vals[d][m])
                    rows.append(row)
    return rows


def _pct(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else 100.0 * (x / ref - 1)


def slo(g: Groups, ds: Dataset, analysis: AnalysisSection) -> dict[str, Any] | None:
    if not analysis.slo.any:
        return None
    limits = slo_limits(analysis.slo)
    points = []
    capacity: dict[str, Any] = {}
    for sc in g.configs:
        best: tuple[float, int] | None = None
        for c in g.levels(sc):
            # a repeat counts when none of the metrics the SLO reads was left out
            reps = {
                r: p for r, p in g.by[(sc, c)].items() if not any(p.left_out(k) for k in limits)
            }
            meets_all = bool(reps)
            goodputs = []
            for _r, p in sorted(reps.items()):
                meets = all(
                    p.metrics.get(k) is not None and p.metrics[k] <= v for k, v in limits.items()
                )
                meets_all &= meets
                good = sum(1 for t, tp, e in p.per_request if _request_meets(t, tp, e, limits))
                dur = p.metrics.get("duration") or 0
                goodputs.append(good / dur if dur > 0 else 0.0)
            tput = g.mean(sc, c, "output_throughput")
            points.append(
                {
                    "server_config": sc,
                    "concurrency": c,
                    "meets_slo_every_repeat": meets_all,
                    "goodput_req_s": describe(goodputs).mean,
                    "output_throughput": tput,
                }
            )
            if meets_all and tput is not None and (best is None or tput > best[0]):
                best = (tput, c)
        capacity[sc] = (
            {"concurrency": best[1], "output_throughput": best[0]}
            if best
            else {
                "concurrency": None,
                "output_throughput": None,
                "reason": "no point meets the SLO in every repeat",
            }
        )
    return {"slo": limits, "points": points, "capacity": capacity}


def slo_limits(slo_: SloSection) -> dict[str, float]:
    """The SLO's limits that are set, by metric (p99_ttft_ms, p99_tpot_ms, p99_e2el_ms)."""
    return {
        f.name: float(v) for f in fields(slo_) for v in [getattr(slo_, f.name)] if v is not None
    }


def _request_meets(ttft: float, tpot: float | None, e2el: float, slo_: dict[str, float]) -> bool:
    vals = {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "p99_e2el_ms": e2el}
    return all(vals[k] is None or vals[k] <= v for k, v in slo_.items())  # type: ignore[operator]


# --- diagnoses ------------------------------------------------------------------------------


def _max_num_seqs(cap: dict[str, Any]) -> int | None:
    nd = cap.get("non_default_args") or {}
    for v in (nd.get("max_num_seqs"), cap.get("max_num_seqs")):
        if isinstance(v, int | float) and not isinstance(v, bool):
            return int(v)
    return None


def diagnoses(
    g: Groups,
    ds: Dataset,
    knees: list[dict[str, Any]],
    dominated: list[dict[str, Any]],
    analysis: AnalysisSection,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sc in g.configs:
        lv = [c for c in g.levels(sc) if g.mean(sc, c, "output_throughput") is not None]
        cap = ds.capacity.get(sc, {})
        means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
        flat = _flat_span(g, sc, lv, means, analysis)
        if flat is not None:
            mns = _max_num_seqs(cap)
            out.append(
                {
                    "kind": "serialized",
                    "server_config": sc,
                    "evidence": {**flat, "max_num_seqs": mns},
                    "suggestion": (
                        "the server handles one request at a time: throughput is flat and wall "
                        "time grows linearly with the number of requests; "
                        + (
                            f"--max-num-seqs is {mns}: raise it"
                            if mns is not None
                            else "check --max-num-seqs and the scheduler limits"
                        )
                    ),
                }
            )
        mns = _max_num_seqs(cap)
        maxconc = cap.get("max_concurrency")
        if mns is not None and isinstance(maxconc, int | float) and mns < math.floor(maxconc):
            out.append(
                {
                    "kind": "kv_headroom_unused",
                    "server_config": sc,
                    "evidence": {
                        "max_num_seqs": mns,
                        "max_concurrency": maxconc,
                        "tokens_per_request": cap.get("max_concurrency_tokens_per_request"),
                        "kv_cache_tokens": cap.get("kv_cache_tokens"),
                    },
                    "suggested_max_num_seqs": math.floor(maxconc),
                    "suggestion": (
                        f"the startup log says the KV cache fits {maxconc:g} sequences of "
                        f"{cap.get('max_concurrency_tokens_per_request')} tokens, but "
                        f"--max-num-seqs is {mns}; try --max-num-seqs {math.floor(maxconc)}"
                    ),
                }
            )
        dip = _dip(g, sc, lv, analysis)
        if dip is not None:
            nd = cap.get("non_default_args") or {}
            sizes = next((v for k, v in sorted(nd.items()) if "capture_sizes" in k), None)
            out.append(
                {
                    "kind": "non_monotonic",
                    "server_config": sc,
                    "concurrency": dip["concurrency"],
                    "capture_sizes": sizes,
                    "evidence": dip,
                    "suggestion": (
                        "throughput dips here and recovers at higher concurrency: avoid "
                        "this operating point (on GPUs, often a batch size outside the "
                        "captured CUDA graphs)"
                    ),
                }
            )
        out += _utilization_misleading(g, sc, lv, means)
    for k in knees:
        if k["concurrency"] is None:
            continue
        past = [c for c in g.levels(k["server_config"]) if c > k["concurrency"]]
        if past:
            out.append(
                {
                    "kind": "past_knee",
                    "server_config": k["server_config"],
                    "concurrency": past,
                    "evidence": {"knee": k["concurrency"], "reason": k["reason"]},
                    "suggestion": (
                        f"concurrency above {k['concurrency']} adds latency, not throughput"
                    ),
                }
            )
    for d in dominated:
        out.append(
            {
                "kind": "dominated",
                "server_config": d["server_config"],
                "concurrency": d["concurrency"],
                "evidence": d,
                "suggestion": (
                    f"concurrency {d['dominated_by']} is at least as good on "
                    "throughput, TTFT and TPOT: do not operate here"
                ),
            }
        )
    return out


def _flat_span(
    g: Groups, sc: str, lv: list[int], means: dict[int, float], analysis: AnalysisSection
) -> dict[str, Any] | None:
    """The widest run of consecutive levels spanning at least 4x in concurrency over which
    throughput varies less than flat_pct and seconds per request (duration / prompts) stay
    within LINEAR_TOLERANCE, i.e. wall time grows linearly with the number of requests."""
    best: dict[str, Any] | None = None
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


def _dip(g: Groups, sc: str, lv: list[int], analysis: AnalysisSection) -> dict[str, Any] | None:
    means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
    for i, c in enumerate(lv):
        lower = [d for d in lv[:i] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)]
        higher = [
            d for d in lv[i + 1 :] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)
        ]
        if lower and higher:
            ref = max(lower, key=lambda d: means[d])
            va, vb = g.pair(sc, ref, sc, c, "output_throughput")
            test = paired(va, vb, analysis.threshold_pct, analysis.alpha)
            if test.verdict == "a > b":
                return {
                    "concurrency": c,
                    "throughput": means[c],
                    "lower_concurrency": ref,
                    "lower_throughput": means[ref],
                    "recovers_at": higher[0],
                    "agree": test.agree,
                    "p_value": test.p_value,
                }
    return None


def _utilization_misleading(
    g: Groups, sc: str, lv: list[int], means: dict[int, float]
) -> list[dict[str, Any]]:
    """Utilization >= 95% at points delivering under half the best throughput (needs telemetry)."""
    best = max(means.values(), default=0.0)
    hits = []
    for c in lv:
        utils = [float(v) for v in g.values(sc, c, "utilization_pct").values()]
        if utils and min(utils) >= 95.0 and best > 0 and means[c] < 0.5 * best:
            hits.append(
                {
                    "concurrency": c,
                    "utilization_pct": min(utils),
                    "output_throughput": means[c],
                    "best_throughput": best,
                }
            )
    if not hits:
        return []
    return [
        {
            "kind": "utilization_misleading",
            "server_config": sc,
            "concurrency": [h["concurrency"] for h in hits],
            "evidence": hits,
            "suggestion": "the device reads fully busy while delivering under half the best "
            "throughput: judge by tokens/s, not utilization",
        }
    ]


# --- validity in the tables and claims ------------------------------------------------------


def _hit_order(h: tuple[Point, Flag]) -> tuple[str, int, int, int]:
    p, f = h
    return (p.server_config, p.concurrency, p.repeat, list(BY_NAME).index(f.check))


def invalid_text(hits: list[tuple[Point, Flag]]) -> str:
    """'invalid: rep02 c=1 max-num-seqs-1: 4 of 4 requests delivered in one read; ...'"""
    seen: list[str] = []
    for p, f in sorted(hits, key=_hit_order):
        text = f"{p.label}: {f.reason}"
        if text not in seen:
            seen.append(text)
    more = len(seen) - INVALID_SHOWN
    shown = "; ".join(seen[:INVALID_SHOWN]) + (f"; and {more} more" if more > 0 else "")
    return f"invalid: {shown}"


def _claim_left_out(
    g: Groups, keys: list[tuple[str, int]], metrics: list[str]
) -> list[tuple[Point, Flag]]:
    found: dict[tuple[str, int, int, str], tuple[Point, Flag]] = {}
    for sc, c in keys:
        for m in metrics:
            for p, f in g.left_out(sc, c, m):
                found.setdefault((sc, c, p.repeat, f.check), (p, f))
    return sorted(found.values(), key=_hit_order)


def _invalid_claim(claim: str, hits: list[tuple[Point, Flag]]) -> dict[str, Any]:
    return {
        "claim": claim,
        "verdict": "invalid",
        "reason": invalid_text(hits),
        "evidence": {
            "invalid": [
                {
                    "server_config": p.server_config,
                    "repeat": p.repeat,
                    "concurrency": p.concurrency,
                    "check": f.check,
                    "reason": f.reason,
                }
                for p, f in sorted(hits, key=_hit_order)
            ]
        },
    }


def validity_summary(g: Groups) -> dict[str, Any]:
    """Per check: its threshold and how many points passed, failed, were noted or not checked."""
    from servelab.analysis.validity import counts

    c = counts(g.point_flags())
    return {
        k.name: {"threshold": k.threshold(g.thresholds), "affects": k.affects, **c[k.name]}
        for k in CHECKS
    }


# --- claims -------------------------------------------------------------------------------


def _selector(text: str, claim: str, g: Groups, need_c: bool = True) -> tuple[str, int | None]:
    parts = dict(p.split("=", 1) for p in (x.strip() for x in text.split(",")) if "=" in p)
    keys = set(parts) - {"c", "config"}
    bad = [x.strip() for x in text.split(",") if x.strip() and "=" not in x]
    if keys or bad:
        raise ServelabError(f"analysis.claims: {claim!r}: selectors are c=N and config=NAME")
    sc = parts.get("config", "").strip()
    if not sc:
        if len(g.configs) != 1:
            raise ServelabError(
                f"analysis.claims: {claim!r}: name the config=..., there are several"
            )
        sc = g.configs[0]
    if sc not in g.configs:
        raise ServelabError(f"analysis.claims: {claim!r}: config {sc!r} was not measured")
    c = parts.get("c")
    if c is None:
        if need_c:
            raise ServelabError(f"analysis.claims: {claim!r}: give the concurrency, e.g. [c=8]")
        return sc, None
    if not c.strip().isdigit() or int(c) not in g.levels(sc):
        raise ServelabError(
            f"analysis.claims: {claim!r}: concurrency {c} was not measured for {sc}"
        )
    return sc, int(c)


def evaluate_claims(
    g: Groups,
    analysis: AnalysisSection,
    knees: list[dict[str, Any]],
    dominated: list[dict[str, Any]],
    diags: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for claim in analysis.claims:
        try:
            parse_claim(claim)
        except ServelabError as exc:
            raise ServelabError(f"analysis.claims: {exc}") from None
        m = _CMP.match(claim)
        if m:
            ma, sel_a, op, factor, mb, sel_b = m.groups()
            metric_a = ALIASES.get(ma, ma)
            metric_b = ALIASES.get(mb, mb)
            if metric_a != metric_b or metric_a not in SUMMARY_METRICS:
                raise ServelabError(
                    f"analysis.claims: {claim!r}: compare one metric of "
                    f"{', '.join(SUMMARY_METRICS)}"
                )
            sa, ca = _selector(sel_a, claim, g)
            sb, cb = _selector(sel_b, claim, g)
            lost = _claim_left_out(g, [(sa, ca), (sb, cb)], [metric_a])  # type: ignore[list-item]
            if lost:
                out.append(_invalid_claim(claim, lost))
                continue
            va, vb = g.pair(sa, ca, sb, cb, metric_a)  # type: ignore[arg-type]
            k = float(factor) if factor else 1.0
            test = paired(
                va, [k * x for x in vb], 0.0 if factor else analysis.threshold_pct, analysis.alpha
            )
            want = "a > b" if op == ">" else "a < b"
            if test.verdict == want:
                verdict = "holds"
            elif test.verdict in ("a > b", "a < b"):
                verdict = "fails"
            else:
                verdict = "inconclusive"
            out.append(
                {
                    "claim": claim,
                    "verdict": verdict,
                    "evidence": {
                        "a": {"config": sa, "concurrency": ca, "mean": describe(va).mean},
                        "b": {
                            "config": sb,
                            "concurrency": cb,
                            "mean": describe(vb).mean,
                            "factor": k,
                        },
                        "n": test.n,
                        "mean_rel_diff_pct": test.mean_rel_diff_pct,
                        "agree": test.agree,
                        "p_value": test.p_value,
                        "test_verdict": test.verdict,
                    },
                }
            )
            continue
        f = _FUNC.match(claim)
        assert f is not None
        func, args, expect = f.groups()
        sc, c = _selector(args, claim, g, need_c=func in ("dominated", "past_knee"))
        # these read the means of every level of the config
        lost = _claim_left_out(g, [(sc, lv) for lv in g.levels(sc)], CLAIM_READS[func])
        if lost:
            out.append(_invalid_claim(claim, lost))
            continue
        if func in ("dominated", "past_knee"):
            if func == "dominated":
                hits = [d for d in dominated if d["server_config"] == sc and d["concurrency"] == c]
            else:
                hits = [
                    d
                    for d in diags
                    if d["kind"] == "past_knee"
                    and d["server_config"] == sc
                    and c in d["concurrency"]
                ]
            out.append({"claim": claim, "verdict": "holds" if hits else "fails", "evidence": hits})
        elif func == "serialized":
            hits = [d for d in diags if d["kind"] == "serialized" and d["server_config"] == sc]
            out.append({"claim": claim, "verdict": "holds" if hits else "fails", "evidence": hits})
        else:
            kn = next(x for x in knees if x["server_config"] == sc)
            ok = kn["concurrency"] is not None and (
                expect is None or kn["concurrency"] == int(expect)
            )
            out.append({"claim": claim, "verdict": "holds" if ok else "fails", "evidence": kn})
    return out
