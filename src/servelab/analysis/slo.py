"""SLO capacity and goodput (slo.json): per level, whether every repeat meets the SLO's p99
limits, the requests per second that meet them one by one, and the best level that does."""

from __future__ import annotations

from dataclasses import fields

from servelab.analysis.groups import Groups
from servelab.analysis.stats import describe
from servelab.documents.declared import SloJson
from servelab.experiment import AnalysisSection, SloSection


def slo_capacity(g: Groups, analysis: AnalysisSection) -> SloJson | None:
    if not analysis.slo.any:
        return None
    limits = slo_limits(analysis.slo)
    points: list[dict[str, str | bool | float | None]] = []
    capacity: dict[str, dict[str, str | float | None]] = {}
    for sc in g.configs:
        best: tuple[float, int | float] | None = None
        for c in g.levels(sc):
            # a repeat counts when none of the metrics the SLO reads was left out
            reps = {
                r: p for r, p in g.by[(sc, c)].items() if not any(p.left_out(k) for k in limits)
            }
            meets_all = bool(reps)
            goodputs = []
            for _r, p in sorted(reps.items()):
                meets = all(
                    isinstance(m := p.metrics.get(k), int | float) and m <= v
                    for k, v in limits.items()
                )
                meets_all &= meets
                good = sum(1 for t, tp, e in p.per_request if _request_meets(t, tp, e, limits))
                dur = p.metrics.get("duration") or 0
                goodputs.append(good / dur if isinstance(dur, int | float) and dur > 0 else 0.0)
            tput = g.mean(sc, c, "output_throughput")
            points.append(
                {
                    "server_config": sc,
                    g.axis: c,
                    "meets_slo_every_repeat": meets_all,
                    "goodput_req_s": describe(goodputs).mean,
                    "output_throughput": tput,
                }
            )
            if meets_all and tput is not None and (best is None or tput > best[0]):
                best = (tput, c)
        capacity[sc] = (
            {g.axis: best[1], "output_throughput": best[0]}
            if best
            else {
                g.axis: None,
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
    return all(_within(vals[k], v) for k, v in slo_.items())


def _within(value: float | None, limit: float) -> bool:
    """A request's latency against an SLO limit: met at or below it, or when it has none (TPOT
    of a single output token)."""
    return value is None or value <= limit
