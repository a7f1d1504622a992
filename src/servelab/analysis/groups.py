"""Points grouped by server configuration and level (a concurrency, or a request rate in an
open-loop sweep: `Groups.axis`), and the per-point, per-level and
paired tables read from them (points.csv, summary.csv, paired.csv).

`Groups.values` is what every statistic reads: a metric of a point that failed a validity check
affecting it is left out there; `invalid_text` says which and why wherever a verdict is missing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TypedDict, cast

from servelab.analysis.dataset import Dataset, Point
from servelab.analysis.stats import describe, paired
from servelab.analysis.validity import BY_NAME, Flag, PointFlags, failed, level_name
from servelab.design.level import LevelValue
from servelab.documents.declared import RecordJson
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection
from servelab.metrics import LATENCIES, PERCENTILES, Tail, insufficient, percentile_of, tail
from servelab.telemetry.columns import Cell, telemetry_columns

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
        for lat in LATENCIES
        for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")
    ]
    + ["achieved_concurrency", "mean_in_flight", "client_cpu_s"]
    # each latency's tail: how many values, the largest, and each percentile's 95% interval
    + [
        column
        for lat in LATENCIES
        for column in (
            f"n_{lat}",
            f"max_{lat}_ms",
            *(f"p{p}_{lat}_ms_{end}" for p in PERCENTILES for end in ("low", "high")),
        )
    ]
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
# the columns of points.csv (then the telemetry columns, where points have telemetry),
# summary.csv and paired.csv
POINTS_COLUMNS = (
    "server_config",
    "repeat",
    "concurrency",
    "position",
    "valid",
    "invalid_reasons",
    *POINT_METRICS,
)
SUMMARY_COLUMNS = (
    "server_config",
    "concurrency",
    "metric",
    "n",
    "mean",
    "sd",
    "cv_pct",
    "ci95_low",
    "ci95_high",
    "min",
    "max",
)
PAIRED_COLUMNS = (
    "server_config",
    "a",
    "b",
    "metric",
    "n",
    "mean_rel_diff_pct",
    "agree",
    "p_value",
    "verdict",
)


class PairedRow(TypedDict):
    """One row of paired.csv: two levels of a config compared on a metric, repeat by repeat
    (analysis.stats.paired); without a p-value and with an "invalid: ..." verdict where a
    validity check left a repeat out."""

    server_config: str
    a: LevelValue
    b: LevelValue
    metric: str
    n: int
    mean_rel_diff_pct: float | None
    agree: str
    p_value: float | None
    verdict: str


def with_axis(columns: tuple[str, ...] | list[str], axis: str) -> list[str]:
    """A table's columns for a sweep over `axis`: its level column named for it (rate)."""
    return [axis if c == "concurrency" else c for c in columns]


INVALID_SHOWN = 3  # points named in an "invalid: ..." text before "and N more"


def axis_of(ds: Dataset) -> str:
    """What the dataset's sweep varies: "rate" when its points are open-loop, else
    "concurrency" (an error when it holds both: one analysis reads one axis)."""
    kinds = {p.level.axis for p in ds.points}
    if len(kinds) > 1:
        raise ServelabError(
            f"{ds.root}: holds points at concurrency levels and at request rates; analyse a "
            "sweep over one of the two (give each its own results_dir)"
        )
    return kinds.pop() if kinds else "concurrency"


class Groups:
    """Points indexed by (server_config, level) -> {repeat: Point}; `axis` says what a level is
    ("concurrency" or "rate"), and is the key tables and verdicts name it by.

    `values` is what every statistic reads: a metric of a point that failed a validity check
    affecting it is left out there (and so out of means, tests, knee, dominance, SLO, diagnoses
    and claims); `left_out` says which and why.
    """

    def __init__(self, ds: Dataset) -> None:
        self.by: dict[tuple[str, LevelValue], dict[int, Point]] = defaultdict(dict)
        for p in ds.points:
            self.by[(p.server_config, p.level.value)][p.repeat] = p
        self.configs = ds.configs()
        self.thresholds = ds.validity
        self.axis = axis_of(ds)

    @property
    def open_loop(self) -> bool:
        return self.axis == "rate"

    def level_name(self, level: LevelValue) -> str:
        """c=8, or rate=2.5."""
        return level_name(level, self.axis)

    def levels(self, sc: str) -> list[LevelValue]:
        return sorted(c for (s, c) in self.by if s == sc)

    def values(self, sc: str, c: LevelValue, metric: str) -> dict[int, float]:
        """The repeats' values of a numeric `metric` that count, by repeat."""
        return {
            r: v
            for r, p in self.by.get((sc, c), {}).items()
            if isinstance(v := p.metrics.get(metric), int | float) and not p.left_out(metric)
        }

    def valid_points(self, sc: str, c: LevelValue, metric: str) -> list[Point]:
        """The repeats of a point whose `metric` counts, by repeat."""
        reps = self.by.get((sc, c), {})
        return [reps[r] for r in sorted(reps) if not reps[r].left_out(metric)]

    def left_out(self, sc: str, c: LevelValue, metric: str) -> list[tuple[Point, Flag]]:
        reps = self.by.get((sc, c), {})
        return [(reps[r], f) for r in sorted(reps) for f in reps[r].left_out(metric)]

    def point_flags(self) -> list[PointFlags]:
        return [
            (sc, r, c, p.checks)
            for (sc, c), reps in sorted(self.by.items())
            for r, p in sorted(reps.items())
        ]

    def point_records(self) -> dict[tuple[str, int, LevelValue], RecordJson]:
        """Of each point measured more than once: which attempt is used and why (validity.json
        `record`)."""
        return {
            (sc, r, c): p.extra["record"]
            for (sc, c), reps in self.by.items()
            for r, p in reps.items()
            if "record" in p.extra
        }

    def insufficient(self, sc: str, c: LevelValue, metric: str) -> list[str]:
        """Of a percentile `metric` (p99_ttft_ms) that a counted repeat of the point has too
        few values to report: the point and why, e.g. 'c=4 a (n = 16 in 3 of 3 repeats: max
        63.0 ms; p99 needs 368)'; empty when every counted repeat reports it, and for any other
        metric."""
        of = percentile_of(metric)
        if of is None:
            return []
        lat, p = of
        counted = self.valid_points(sc, c, metric)
        short = [
            point
            for point in counted
            if point.metrics.get(metric) is None
            and isinstance(point.metrics.get(f"n_{lat}"), int | float)
        ]
        if not short:
            return []
        ns = sorted({int(cast(float, point.metrics[f"n_{lat}"])) for point in short})
        tops = [
            t for point in short if isinstance(t := point.metrics.get(f"max_{lat}_ms"), int | float)
        ]
        n = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]} to {ns[-1]}"
        n += f" in {len(short)} of {len(counted)} repeats"
        return [f"{self.level_name(c)} {sc} ({insufficient(p, n, max(tops) if tops else None)})"]

    def pooled(self, sc: str, c: LevelValue, lat: str) -> Tail:
        """A latency's tail over the requests of every repeat of a point it counts in (TTFT,
        TPOT, E2EL: Point.per_request), as one sample."""
        index = {"ttft": 0, "tpot": 1, "e2el": 2}[lat]
        values = [
            v
            for point in self.valid_points(sc, c, f"mean_{lat}_ms")
            for v in (r[index] for r in point.per_request)
            if v is not None
        ]
        return tail(values)

    def mean(self, sc: str, c: LevelValue, metric: str) -> float | None:
        return describe(list(self.values(sc, c, metric).values())).mean

    def pair(
        self, sc_a: str, a: LevelValue, sc_b: str, b: LevelValue, metric: str
    ) -> tuple[list[float], list[float]]:
        va, vb = self.values(sc_a, a, metric), self.values(sc_b, b, metric)
        reps = sorted(set(va) & set(vb))
        return [va[r] for r in reps], [vb[r] for r in reps]


def points_table(ds: Dataset) -> list[dict[str, Cell]]:
    """points.csv's rows: a column each (its level's named for the sweep's axis)."""
    rows = []
    for p in sorted(ds.points, key=lambda p: (p.server_config, p.level.value, p.repeat)):
        row: dict[str, Cell] = {
            "server_config": p.server_config,
            "repeat": p.repeat,
            **p.level.to_json(),
            "position": p.position,
            "valid": p.valid,
            "invalid_reasons": "; ".join(f"{f.check}: {f.reason}" for f in failed(p.checks)),
        }
        row.update({m: p.metrics.get(m) for m in POINT_METRICS})
        if "telemetry" in p.extra:  # the telemetry columns, where the point has telemetry
            row.update(telemetry_columns(p.extra["telemetry"]))
        rows.append(row)
    return rows


def summary_table(g: Groups) -> list[dict[str, Cell]]:
    """summary.csv's rows: a column each (the level's named for the sweep's axis)."""
    rows: list[dict[str, Cell]] = []
    for sc in g.configs:
        for c in g.levels(sc):
            for m in SUMMARY_METRICS:
                d = describe(list(g.values(sc, c, m).values()))
                rows.append(
                    {
                        "server_config": sc,
                        g.axis: c,
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


def pair_specs(g: Groups, analysis: AnalysisSection) -> list[tuple[str, LevelValue, LevelValue]]:
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


def paired_table(g: Groups, analysis: AnalysisSection) -> list[PairedRow]:
    rows: list[PairedRow] = []
    for sc, a, b in pair_specs(g, analysis):
        for m in PAIRED_METRICS:
            va, vb = g.pair(sc, a, sc, b, m)
            r = paired(va, vb, analysis.threshold_pct, analysis.alpha)
            hits = g.left_out(sc, a, m) + g.left_out(sc, b, m)
            short = g.insufficient(sc, a, m) + g.insufficient(sc, b, m)
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
                    "p_value": None if hits or short else r.p_value,
                    "verdict": invalid_text(hits)
                    if hits
                    else insufficient_text(short)
                    if short
                    else r.verdict,
                }
            )
    return rows


def hit_order(h: tuple[Point, Flag]) -> tuple[str, LevelValue, int, int]:
    p, f = h
    return (p.server_config, p.level.value, p.repeat, list(BY_NAME).index(f.check))


def insufficient_text(short: list[str]) -> str:
    """'insufficient: c=2 a (n = 4 in 3 of 3 repeats: max 21.0 ms; p99 needs 368); ...'"""
    more = len(short) - INVALID_SHOWN
    shown = "; ".join(short[:INVALID_SHOWN]) + (f"; and {more} more" if more > 0 else "")
    return f"insufficient: {shown}"


def invalid_text(hits: list[tuple[Point, Flag]]) -> str:
    """'invalid: rep02 c=1 max-num-seqs-1: 4 of 4 requests delivered in one read; ...'"""
    seen: list[str] = []
    for p, f in sorted(hits, key=hit_order):
        text = f"{p.label}: {f.reason}"
        if text not in seen:
            seen.append(text)
    more = len(seen) - INVALID_SHOWN
    shown = "; ".join(seen[:INVALID_SHOWN]) + (f"; and {more} more" if more > 0 else "")
    return f"invalid: {shown}"
