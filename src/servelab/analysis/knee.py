"""Where adding load stops paying: the knee of each configuration's throughput curve (in
concurrency, or in request rate for an open-loop sweep: the entries then say `rate`), and the
operating points another level beats on throughput, TTFT and TPOT at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.analysis.groups import Groups
from servelab.analysis.stats import evidence_level, paired
from servelab.design.level import LevelValue
from servelab.documents.declared import Knee, KneeEvidence
from servelab.experiment import AnalysisSection

# throughput: higher is better; latencies: lower is better
DOMINANCE = [
    ("output_throughput", 1),
    ("mean_ttft_ms", -1),
    ("p99_ttft_ms", -1),
    ("mean_tpot_ms", -1),
    ("p99_tpot_ms", -1),
]
DOMINANCE_COLUMNS = (
    "server_config",
    "concurrency",
    "dominated_by",
    *(f"{m}_delta_pct" for m, _ in DOMINANCE),
)
# a row of dominance.csv (DOMINANCE_COLUMNS): the server config, the level dominated (keyed by
# the sweep's axis, "concurrency" or "rate"), the level dominating it and each metric's delta
DominanceRow = dict[str, str | LevelValue | None]


def dominance_levels(row: DominanceRow, axis: str) -> tuple[LevelValue, LevelValue]:
    """A dominance row's level and the level that dominates it."""
    at, by = row[axis], row["dominated_by"]
    assert isinstance(at, int | float) and isinstance(by, int | float)
    return at, by


def knee_level(k: Knee, axis: str) -> LevelValue | None:
    """A knee's level on `axis` ("concurrency" or "rate"); None where there is no knee."""
    return k["rate"] if axis == "rate" else k["concurrency"]


def _at(k: Knee, axis: str, level: LevelValue | None) -> None:
    if axis == "rate":
        k["rate"] = level
    else:  # a concurrency is a whole number
        k["concurrency"] = None if level is None else int(level)


def _next(ev: KneeEvidence, axis: str, level: LevelValue) -> KneeEvidence:
    if axis == "rate":
        ev["next_rate"] = level
    else:
        ev["next_concurrency"] = level
    return ev


@dataclass(frozen=True)
class _Curve:
    """One configuration's throughput curve: its levels with throughput, their throughput
    means and the p99 and mean TTFT means of every level (a p99 None where its points hold
    too few requests to report it)."""

    sc: str
    usable: list[LevelValue]
    means: dict[LevelValue, float]
    p99: dict[LevelValue, float | None]
    mean_ttft: dict[LevelValue, float | None]

    def ttft(self, lo: LevelValue, hi: LevelValue) -> tuple[str, float | None, float | None]:
        """The TTFT the plateau rule reads between two levels: p99 where both levels report
        it, else the mean (metric, value at lo, value at hi)."""
        if self.p99[lo] is not None and self.p99[hi] is not None:
            return "p99_ttft_ms", self.p99[lo], self.p99[hi]
        return "mean_ttft_ms", self.mean_ttft[lo], self.mean_ttft[hi]


def knee(g: Groups, analysis: AnalysisSection) -> list[Knee]:
    out: list[Knee] = []
    for sc in g.configs:
        lv = g.levels(sc)
        all_means = {c: g.mean(sc, c, "output_throughput") for c in lv}
        p99 = {c: g.mean(sc, c, "p99_ttft_ms") for c in lv}
        axis = g.axis
        word = "request rate" if g.open_loop else "concurrency"
        # the levels with a throughput mean, in level order
        means = {c: m for c, m in all_means.items() if m is not None}
        usable = list(means)
        entry: Knee = {
            "server_config": sc,
            "reason": "",
            "evidence": {},
            "evidence_level": evidence_level(
                min((len(g.values(sc, c, "output_throughput")) for c in usable), default=0)
            ),
        }
        _at(entry, axis, None)
        if len(usable) < 2:
            entry["reason"] = f"fewer than two {word} levels with throughput"
            out.append(entry)
            continue
        curve = _Curve(sc, usable, means, p99, {c: g.mean(sc, c, "mean_ttft_ms") for c in lv})
        if not _peak(g, curve, entry, analysis):
            _plateau(g, curve, entry, analysis)
        out.append(entry)
    return out


def _peak(g: Groups, curve: _Curve, entry: Knee, analysis: AnalysisSection) -> bool:
    """The knee at the best level when the next level falls in every repeat."""
    sc, usable, means, axis = curve.sc, curve.usable, curve.means, g.axis
    best = max(usable, key=lambda c: (means[c], -c))
    after = [c for c in usable if c > best]
    if not after:
        return False
    nxt = after[0]
    va, vb = g.pair(sc, best, sc, nxt, "output_throughput")
    if not (va and all(x > y for x, y in zip(va, vb, strict=True))):
        return False
    _at(entry, axis, best)
    entry["reason"] = (
        f"throughput peaks at {best} and falls at {nxt} in every repeat ({len(va)}/{len(va)})"
        if len(va) > 1
        else f"throughput peaks at {best} and falls at {nxt} (1 repeat)"
    )
    entry["evidence_level"] = evidence_level(
        len(va), paired(va, vb, analysis.threshold_pct, analysis.alpha)
    )
    ev: KneeEvidence = {"peak_throughput": means[best]}
    entry["evidence"] = _next(ev, axis, nxt)
    ev["next_throughput"] = means[nxt]
    ev["change_pct"] = 100.0 * (means[nxt] / means[best] - 1)
    ev["repeats_falling"] = f"{len(va)}/{len(va)}"
    return True


def _plateau(g: Groups, curve: _Curve, entry: Knee, analysis: AnalysisSection) -> None:
    """The knee at the first level that no later level beats by the plateau margin, provided
    latency grows past it; else none."""
    usable, means, axis = curve.usable, curve.means, g.axis
    word = "request rate" if g.open_loop else "concurrency"
    for i, lo in enumerate(usable[:-1]):
        hi = usable[i + 1]
        later_best = max(means[c] for c in usable[i + 1 :])
        gain = 100.0 * (later_best / means[lo] - 1) if means[lo] else math.inf
        metric, at_lo, at_hi = curve.ttft(lo, hi)
        grows = at_hi is not None and at_lo is not None and at_hi > at_lo
        if gain < analysis.plateau_pct and grows:
            _at(entry, axis, lo)
            entry["reason"] = (
                f"throughput stops rising after {lo} (no higher {word} gains "
                f"{analysis.plateau_pct:g}% or more; best later {gain:+.1f}%) "
                f"while {metric.split('_')[0]} TTFT grows"
            )
            ev: KneeEvidence = {"throughput": means[lo], "best_later_gain_pct": gain}
            entry["evidence"] = _next(ev, axis, hi)
            ev["p99_ttft_ms"] = curve.p99[lo]
            ev["next_p99_ttft_ms"] = curve.p99[hi]
            if metric == "mean_ttft_ms":  # the p99s too few requests report: the means
                ev["mean_ttft_ms"] = at_lo
                ev["next_mean_ttft_ms"] = at_hi
            return
    entry["reason"] = (
        f"no knee: throughput still rises up to the highest {word} measured ({usable[-1]})"
    )


def dominance(g: Groups) -> list[DominanceRow]:
    rows = []
    for sc in g.configs:
        # the levels with a mean of every DOMINANCE metric that has one at all (a percentile
        # too few requests report is left out: dominance_metrics), in level order
        vals = {c: ms for c in g.levels(sc) if (ms := _dominance_means(g, sc, c)) is not None}
        for c in vals:
            for d in vals:
                if c == d:
                    continue
                both = [(m, sign) for m, sign in DOMINANCE if m in vals[c] and m in vals[d]]
                better_eq = all(sign * (vals[d][m] - vals[c][m]) >= 0 for m, sign in both)
                strictly = any(sign * (vals[d][m] - vals[c][m]) > 0 for m, sign in both)
                if better_eq and strictly:
                    row: DominanceRow = {"server_config": sc, g.axis: c, "dominated_by": d}
                    for m, _ in DOMINANCE:
                        row[f"{m}_delta_pct"] = _pct(vals[c].get(m), vals[d].get(m))
                    rows.append(row)
    return rows


def _dominance_means(g: Groups, sc: str, c: LevelValue) -> dict[str, float] | None:
    """The level's mean of each DOMINANCE metric, by metric; None when one has no mean,
    unless it is a percentile its requests are too few to report (Groups.insufficient): that
    one is left out of the comparison."""
    out: dict[str, float] = {}
    for m, _ in DOMINANCE:
        v = g.mean(sc, c, m)
        if v is not None:
            out[m] = v
        elif not g.insufficient(sc, c, m):
            return None
    return out


def _pct(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else 100.0 * (x / ref - 1)
