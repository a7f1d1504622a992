"""Where adding load stops paying: the knee of each configuration's throughput curve (in
concurrency, or in request rate for an open-loop sweep: the entries then say `rate`), and the
operating points another level beats on throughput, TTFT and TPOT at once."""

from __future__ import annotations

import math
from typing import Any

from servelab.analysis.groups import Groups
from servelab.analysis.stats import evidence_level, paired
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


def knee(g: Groups, analysis: AnalysisSection) -> list[dict[str, Any]]:
    out = []
    for sc in g.configs:
        lv = g.levels(sc)
        means = {c: g.mean(sc, c, "output_throughput") for c in lv}
        p99 = {c: g.mean(sc, c, "p99_ttft_ms") for c in lv}
        axis = g.axis
        word = "request rate" if g.open_loop else "concurrency"
        entry: dict[str, Any] = {
            "server_config": sc,
            axis: None,
            "reason": "",
            "evidence": {},
        }
        usable = [c for c in lv if means[c] is not None]
        entry["evidence_level"] = evidence_level(
            min((len(g.values(sc, c, "output_throughput")) for c in usable), default=0)
        )
        if len(usable) < 2:
            entry["reason"] = f"fewer than two {word} levels with throughput"
            out.append(entry)
            continue
        best = max(usable, key=lambda c: (means[c], -c))
        after = [c for c in usable if c > best]
        if after:
            nxt = after[0]
            va, vb = g.pair(sc, best, sc, nxt, "output_throughput")
            if va and all(x > y for x, y in zip(va, vb, strict=True)):
                entry.update(
                    {axis: best},
                    reason=(
                        f"throughput peaks at {best} and falls at {nxt} in every repeat "
                        f"({len(va)}/{len(va)})"
                        if len(va) > 1
                        else f"throughput peaks at {best} and falls at {nxt} (1 repeat)"
                    ),
                    evidence_level=evidence_level(
                        len(va), paired(va, vb, analysis.threshold_pct, analysis.alpha)
                    ),
                )
                entry["evidence"] = {
                    "peak_throughput": means[best],
                    f"next_{axis}": nxt,
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
                    {axis: lo},
                    reason=(
                        f"throughput stops rising after {lo} (no higher {word} gains "
                        f"{analysis.plateau_pct:g}% or more; best later {gain:+.1f}%) "
                        "while p99 TTFT grows"
                    ),
                )
                entry["evidence"] = {
                    "throughput": means[lo],
                    "best_later_gain_pct": gain,
                    f"next_{axis}": hi,
                    "p99_ttft_ms": p99[lo],
                    "next_p99_ttft_ms": p99[hi],
                }
                break
        else:
            entry["reason"] = (
                f"no knee: throughput still rises up to the highest {word} measured ({usable[-1]})"
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
                    row: dict[str, Any] = {"server_config": sc, g.axis: c, "dominated_by": d}
                    for m, _ in DOMINANCE:
                        row[f"{m}_delta_pct"] = _pct(vals[c][m], vals[d][m])
                    rows.append(row)
    return rows


def _pct(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else 100.0 * (x / ref - 1)
