"""SLO capacity and goodput (slo.json): per level, the early-stop decision (meets, fails or
undecided; servelab.analysis.early_stop) on whether the share of requests over the SLO's p99
limits is within the 1% a p99 allows, from the requests of every counted repeat pooled; the
requests per second that meet the limits one by one; and the best level that meets.

A level's requests are those of its repeats that none of the SLO's metrics was left out of
(validity); a request counts as over when any latency it has exceeds its limit, and a failed
request counts as over. A level of fewer than 299 requests can never meet a p99 SLO
(`min_requests(0.01)`): it is undecided at best, and an undecided level is never the capacity.
"""

from __future__ import annotations

from dataclasses import fields

from servelab.analysis.dataset import Point
from servelab.analysis.early_stop import CONFIDENCE, Decision, allowed_share, decide, min_requests
from servelab.analysis.groups import Groups
from servelab.analysis.stats import describe
from servelab.documents.declared import SloJson
from servelab.experiment import AnalysisSection, SloSection

# slo.json's format: 2 decides each level by early stopping (1, without the key, had
# `meets_slo_every_repeat`: every repeat's p99 point metric within the limits)
FORMAT_VERSION = 2
# the share of requests within the limits a p99 asks for
P99_TARGET = 0.99


def slo_capacity(g: Groups, analysis: AnalysisSection) -> SloJson | None:
    """slo.json's document; None without an SLO limit."""
    if not analysis.slo.any:
        return None
    limits = slo_limits(analysis.slo)
    allowed = allowed_share(P99_TARGET)
    need = min_requests(allowed, CONFIDENCE)
    assert need is not None  # a share allowed over, above 0, can be met
    points: list[dict[str, str | bool | float | None]] = []
    capacity: dict[str, dict[str, str | float | None]] = {}
    for sc in g.configs:
        best: tuple[float, int | float] | None = None
        decided: list[Decision] = []
        for c in g.levels(sc):
            # a repeat counts when none of the metrics the SLO reads was left out
            reps = [
                p
                for _r, p in sorted(g.by[(sc, c)].items())
                if not any(p.left_out(k) for k in limits)
            ]
            n, k = 0, 0
            goodputs = []
            for p in reps:
                sent, over, good = _counts(p, limits)
                n, k = n + sent, k + over
                dur = p.metrics.get("duration") or 0
                goodputs.append(good / dur if isinstance(dur, int | float) and dur > 0 else 0.0)
            d = decide(n, k, allowed, CONFIDENCE)
            decided.append(d)
            tput = g.mean(sc, c, "output_throughput")
            points.append(
                {
                    "server_config": sc,
                    g.axis: c,
                    "decision": d.decision,
                    "decision_text": d.text(),
                    "repeats": len(reps),
                    "requests": d.n,
                    "over": d.k,
                    "over_lower": d.lower,
                    "over_upper": d.upper,
                    "goodput_req_s": describe(goodputs).mean,
                    "output_throughput": tput,
                }
            )
            if d.decision == "meets" and tput is not None and (best is None or tput > best[0]):
                best = (tput, c)
        capacity[sc] = (
            {g.axis: best[1], "output_throughput": best[0]}
            if best
            else {g.axis: None, "output_throughput": None, "reason": _no_capacity(decided, need)}
        )
    return {
        "format_version": FORMAT_VERSION,
        "slo": limits,
        "allowed_over": allowed,
        "confidence": CONFIDENCE,
        "min_requests": need,
        "points": points,
        "capacity": capacity,
    }


def _counts(p: Point, limits: dict[str, float]) -> tuple[int, int, int]:
    """A repeat's requests: how many it sent, how many were over a limit (a failed request
    counts as over), how many met every limit."""
    done = len(p.per_request)
    sent = p.metrics.get("num_prompts")
    n = max(done, int(sent)) if isinstance(sent, int | float) else done
    good = sum(1 for t, tp, e in p.per_request if _request_meets(t, tp, e, limits))
    return n, n - good, good


def _no_capacity(decided: list[Decision], need: int) -> str:
    """Why no level of a configuration is its capacity: how many failed and how many were
    undecided, and the requests a level needs to be able to meet."""
    if not decided:
        return "no level measured"
    fails = sum(d.decision == "fails" for d in decided)
    undecided = [d for d in decided if d.decision == "undecided"]
    said = f"no level meets the SLO ({fails} failed, {len(undecided)} undecided)"
    if not undecided:
        return said
    most = max(d.n for d in undecided)
    if most < need:
        return (
            f"{said}: a p99 SLO needs at least {need} requests per level, all within the "
            f"limits, to be met; the undecided levels had at most {most}"
        )
    return f"{said}: more requests per level would decide the undecided ones"


def slo_limits(slo_: SloSection) -> dict[str, float]:
    """The SLO's limits that are set, by metric (p99_ttft_ms, p99_tpot_ms, p99_e2el_ms)."""
    return {
        f.name: float(v) for f in fields(slo_) for v in [getattr(slo_, f.name)] if v is not None
    }


def _request_meets(ttft: float, tpot: float | None, e2el: float, slo_: dict[str, float]) -> bool:
    vals = {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "p99_e2el_ms": e2el}
    return all(_within(vals[k], v) for k, v in slo_.items())


def _within(value: float | None, limit: float) -> bool:
    """A request's latency against an SLO limit: met at or below it, or when it has none (TPOT
    of a single output token)."""
    return value is None or value <= limit
