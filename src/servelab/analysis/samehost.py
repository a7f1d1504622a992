"""Server configurations compared on one host, in three words (`analysis.compare`).

A rerun (`servelab rerun`, docs/reproduce.md "Re-run on one host") measures a reference's
server beside the current side in one interleaved experiment and names the pairs to compare in
`analysis.compare` ([{a: <reference side>, b: <current side>}]). For each pair, at every level
both measured and for each metric (throughput, mean TTFT, mean TPOT), B against A round by
round: the speed ratio with its interval and its word, SAME, DIFFERENT (faster or slower) or
UNKNOWN (servelab.analysis.equivalence, margin `analysis.margin_pct`).

The family is every pair x level x metric of the run, read at every look the sequential plan
allows: each row's alpha is alpha / (decisions x looks) (Bonferroni, `equivalence
.family_alpha`), its interval at 1 - 2 x that (two one-sided tests), so that the chance of a
wrong SAME or DIFFERENT anywhere, at any look, stays under the analysis's alpha. A round pairs
with the same round of the other side only when each round ran on a fresh launch of each side
in turn (`sweep.repeats.interleave`); otherwise the two sides' rounds are not independent
replicates (pseudo-replication) and every row is UNKNOWN with that reason. A point a validity
check left out leaves its round out of the pair. Where either side recorded its outputs' token
ids, each pair's `same_outputs` says whether the two gave the same answers
(servelab.analysis.outputs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from servelab.analysis.dataset import Dataset
from servelab.analysis.engine_diff import engine_text, pair_engine
from servelab.analysis.equivalence import (
    METHOD,
    UNKNOWN,
    Decision,
    decide,
    family_alpha,
)
from servelab.analysis.groups import Groups, invalid_text
from servelab.analysis.outputs import OutputsAsk, outputs_line
from servelab.design.level import LevelValue
from servelab.documents.declared import RowJson, SameHostJson, SameHostPair
from servelab.errors import ServelabError
from servelab.experiment import ComparePair

METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
HIGHER_IS_FASTER = frozenset({"output_throughput"})
FORMAT_VERSION = 1
NOT_INTERLEAVED = (
    "not interleaved: each side's rounds ran on one launch, so they are not paired replicates; "
    "set sweep.repeats.interleave: true"
)


def looks_of(ds: Dataset) -> int:
    """The looks the run's plan allows: a sequential sweep's (max - min + 1), else one."""
    seq = ds.sequential
    if not seq:
        return 1
    rule = seq["rule"]
    return int(rule["max_rounds"]) - int(rule["min_rounds"]) + 1


def interleaved(ds: Dataset, configs: Sequence[str]) -> bool:
    """Whether each round of every configuration in `configs` ran on a launch of its own, as
    its points record it (point.json `launch`): a sequential sweep whose points of one
    configuration share no launch across rounds. (The sequential record's `launches` name the
    round of the look that followed each launch, `min` for the first step's, so they cannot
    tell.)"""
    if not ds.sequential:
        return False
    for sc in configs:
        rounds: dict[int | None, set[int]] = {}
        for p in ds.points:
            if p.server_config == sc:
                rounds.setdefault(p.extra.get("launch"), set()).add(p.repeat)
        if not rounds or None in rounds or any(len(r) > 1 for r in rounds.values()):
            return False
    return True


@dataclass(frozen=True)
class _Ask:
    """What every row of a run is asked against: the margin and each row's alpha."""

    margin_pct: float
    alpha: float


def _row(g: Groups, a: str, b: str, level: LevelValue, metric: str, ask: _Ask) -> RowJson:
    hits = g.left_out(a, level, metric) + g.left_out(b, level, metric)
    va, vb = g.pair(a, level, b, level, metric)
    d = decide(vb, va, metric in HIGHER_IS_FASTER, ask.margin_pct, ask.alpha)
    why = d.why
    if hits and d.word == UNKNOWN:
        why = invalid_text(hits) + (f"; {why}" if why else "")
    return _json(level, metric, d, why)


def _json(level: LevelValue, metric: str, d: Decision, why: str | None) -> RowJson:
    return {
        "level": level,
        "metric": metric,
        "word": d.word,
        "direction": d.direction,
        "n": d.n,
        "speed": d.speed,
        "low": d.low,
        "high": d.high,
        "rounds_needed": d.rounds_needed,
        "why": why,
    }


def compared_pairs(
    g: Groups, pairs: Sequence[ComparePair]
) -> list[tuple[str, str, list[LevelValue], tuple[str, ...]]]:
    """Each pair's configurations, the levels both measured and the metrics it asks (in
    METRICS' order); a name the run did not measure raises one line."""
    out = []
    for i, pair in enumerate(pairs):
        a, b = pair.a, pair.b
        for side, name in (("a", a), ("b", b)):
            if name not in g.configs:
                raise ServelabError(
                    f"analysis.compare[{i}].{side}: {name!r} is not a server configuration "
                    f"this run measured ({', '.join(g.configs)}); name one of those"
                )
        metrics = tuple(m for m in METRICS if m in pair.metrics)
        out.append((a, b, [c for c in g.levels(a) if c in g.levels(b)], metrics))
    return out


@dataclass(frozen=True)
class Plan:
    """What the words rest on besides the data: the looks the plan allows and whether each
    round ran on fresh launches in turn (from the run's sequential record when None)."""

    looks: int | None = None
    interleaved: bool | None = None


def same_host(
    ds: Dataset,
    pairs: Sequence[ComparePair],
    margin_pct: float,
    alpha: float,
    plan: Plan = Plan(),
    outputs: OutputsAsk | None = None,
) -> SameHostJson | None:
    """The three words of every pair in `pairs` on the points of `ds` (None when there are
    no pairs); `plan`: the sweep's own, while it measures (its record is not written yet);
    `outputs`: the run's recorded completions, each pair's compared (None: not read)."""
    if not pairs:
        return None
    g = Groups(ds)
    found = compared_pairs(g, pairs)
    decisions = sum(len(levels) * len(metrics) for _, _, levels, metrics in found)
    looks = plan.looks if plan.looks is not None else looks_of(ds)
    each = family_alpha(alpha, decisions, looks)
    sides = sorted({n for a, b, _, _ in found for n in (a, b)})
    paired = plan.interleaved if plan.interleaved is not None else interleaved(ds, sides)
    out: list[SameHostPair] = []
    for a, b, levels, metrics in found:
        ask = _Ask(margin_pct, each)
        rows = [_row(g, a, b, c, m, ask) for c in levels for m in metrics]
        if not paired:
            rows = [_unpaired(r) for r in rows]
        pair: SameHostPair = {
            "a": a,
            "b": b,
            "rows": rows,
            "engine": pair_engine(ds.launches, a, b),
        }
        block = outputs.block(a, b) if outputs is not None else None
        if block is not None:
            pair["same_outputs"] = block
        out.append(pair)
    return {
        "format_version": FORMAT_VERSION,
        "axis": g.axis,
        "method": METHOD,
        "alpha": alpha,
        "margin_pct": margin_pct,
        "decisions": decisions,
        "looks": looks,
        "interval_alpha": each,
        "interleaved": paired,
        "pairs": out,
    }


def _unpaired(row: RowJson) -> RowJson:
    return {
        **row,
        "word": UNKNOWN,
        "direction": None,
        "rounds_needed": None,
        "why": NOT_INTERLEAVED,
    }


def open_rows(doc: SameHostJson | None) -> list[str]:
    """The rows still UNKNOWN, as 'a -> b c=8 output_throughput' (the sequential plan's open
    questions)."""
    if doc is None:
        return []
    return [
        f"{p['a']} -> {p['b']} {doc['axis'][0]}={r['level']} {r['metric']}"
        for p in doc["pairs"]
        for r in p["rows"]
        if r["word"] == UNKNOWN
    ]


def interval_text(speed: float | None, low: float | None, high: float | None) -> str:
    """'0.517 [0.305, 0.879]', or 'n/a' without an interval (a row, a bisection step)."""
    if speed is None or low is None or high is None:
        return "n/a"
    return f"{speed:.3f} [{low:.3f}, {high:.3f}]"


def word_text(word: str, direction: str | None, rounds_needed: int | None) -> str:
    """'DIFFERENT (slower)', or 'UNKNOWN: about 37 rounds in all would decide it'."""
    text = f"{word} ({direction})" if direction else word
    if word == UNKNOWN and rounds_needed:
        text += f": about {rounds_needed} rounds in all would decide it at this spread"
    return text


def _interval(r: RowJson) -> str:
    return interval_text(r["speed"], r["low"], r["high"])


def _word(r: RowJson) -> str:
    text = word_text(r["word"], r["direction"], r["rounds_needed"])
    return text + (f" ({r['why']})" if r["why"] else "")


class Family(TypedDict):
    """What a family of words rests on (a same_host.json's, or a runtimes comparison's)."""

    method: str
    alpha: float
    decisions: int
    looks: int
    interval_alpha: float


def family_text(doc: Family) -> str:
    """'<method>: 9 decisions x 3 looks, each interval at 99.6%, family alpha 0.05'."""
    return (
        f"{doc['method']}: {doc['decisions']} decisions x {doc['looks']} looks, each interval "
        f"at {100 * (1 - 2 * doc['interval_alpha']):.3g}%, family alpha {doc['alpha']:g}"
    )


def same_host_section(doc: SameHostJson | None, level_name: Mapping[Any, str]) -> list[str]:
    """The report's "Compared on this host" section (none without `analysis.compare`)."""
    if doc is None:
        return []
    lines = [
        "",
        "## Compared on this host",
        "",
        f"Each pair measured on this host by today's client, B against A round by round: B's "
        f"speed over A's (a throughput B / A, a latency A / B: above 1, B is faster) with its "
        f"interval, SAME inside the {doc['margin_pct']:g}% margin, DIFFERENT outside it, "
        f"UNKNOWN otherwise ({family_text(doc)}).",
    ]
    if not doc["interleaved"]:
        lines += ["", f"Every row is UNKNOWN: {NOT_INTERLEAVED}."]
    for pair in doc["pairs"]:
        lines += [
            "",
            f"### {pair['b']} against {pair['a']}",
            "",
            outputs_line(pair.get("same_outputs")),
            *engine_text(pair.get("engine")),
            "",
            "| level | metric | rounds | B speed / A [interval] | answer |",
            "|---|---|---|---|---|",
        ]
        for r in pair["rows"]:
            lines.append(
                f"| {level_name[r['level']]} | {r['metric']} | {r['n']} | {_interval(r)} "
                f"| {_word(r)} |"
            )
    return lines
