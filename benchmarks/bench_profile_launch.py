"""Does a server launched with vLLM's torch profiler configured, but never started, measure the
same as one launched without it? servelab's own paired test (servelab.analysis.stats.paired,
the test behind paired.csv and the claims) on every point of a finished run of
config/experiments/profiler-idle-check.yaml: each server configuration `X` against
`X-profiler`, repeat r against repeat r, at every concurrency, for output throughput, mean TTFT
and mean TPOT.

The answer decides `profile.launch: auto` (docs/profile.md, "Which launch"): when no pair
differs (the test calls no difference real at `--alpha` with at least `--threshold-pct`), the
CPU profiling pass may run on the sweep's own launch after its last point, which saves a
server start per profiled configuration.

    snakemake --cores all --configfile config/experiments/profiler-idle-check.yaml
    python benchmarks/bench_profile_launch.py --results results/profiler-idle-check
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import scipy.stats as sps

from servelab.analysis.stats import paired
from servelab.store.rawdata import load_points

METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
SUFFIX = "-profiler"


def pairs_table(results: Path, threshold_pct: float, alpha: float) -> list[dict[str, object]]:
    """One row per (configuration, concurrency, metric): the paired test of `X-profiler`
    against `X` over the repeats both measured."""
    values: dict[tuple[str, int, str], dict[int, float]] = defaultdict(dict)
    for p in load_points(results):
        meta = p.meta
        for m in METRICS:
            v = meta.get(m)
            if isinstance(v, int | float):
                key = (str(meta["server_config"]), int(meta["concurrency"]), m)
                values[key][int(meta["repeat"])] = float(v)
    rows = []
    for (sc, c, m), base in sorted(values.items()):
        if sc.endswith(SUFFIX):
            continue
        other = values.get((sc + SUFFIX, c, m))
        if not other:
            continue
        reps = sorted(set(base) & set(other))
        r = paired([other[i] for i in reps], [base[i] for i in reps], threshold_pct, alpha)
        rows.append(
            {
                "server_config": sc,
                "concurrency": c,
                "metric": m,
                "n": r.n,
                "profiler_vs_plain_pct": None
                if r.mean_rel_diff_pct is None
                else round(r.mean_rel_diff_pct, 2),
                "agree": r.agree,
                "p_value": None if r.p_value is None else round(r.p_value, 4),
                "verdict": r.verdict,
            }
        )
    return rows


def pooled(results: Path) -> list[dict[str, object]]:
    """Per configuration and over all of them: the mean ratio `X-profiler` / `X` over every
    (concurrency, repeat) pair, with a 95% t-interval on the mean of the log ratios. Where the
    paired test per point has little power (3 repeats), this bounds how large a difference
    could have gone unseen."""
    by: dict[tuple[str, int, int], dict[str, Any]] = {}
    for p in load_points(results):
        m = p.meta
        by[(str(m["server_config"]), int(m["concurrency"]), int(m["repeat"]))] = m
    rows = []
    configs = sorted({sc for sc, _, _ in by if not sc.endswith(SUFFIX)})
    for metric in METRICS:
        for which in [*configs, None]:
            logs = [
                math.log(float(by[(sc + SUFFIX, c, r)][metric]) / float(m[metric]))
                for (sc, c, r), m in sorted(by.items())
                if not sc.endswith(SUFFIX)
                and (which is None or sc == which)
                and (sc + SUFFIX, c, r) in by
                and m.get(metric)
                and by[(sc + SUFFIX, c, r)].get(metric)
            ]
            if len(logs) < 2:
                continue
            mean = statistics.fmean(logs)
            half = float(sps.t.ppf(0.975, len(logs) - 1)) * statistics.stdev(logs)
            half /= math.sqrt(len(logs))
            rows.append(
                {
                    "server_config": which or "all",
                    "metric": metric,
                    "n": len(logs),
                    "ratio_pct": round(100 * (math.exp(mean) - 1), 2),
                    "ci95_pct": [
                        round(100 * (math.exp(mean - half) - 1), 2),
                        round(100 * (math.exp(mean + half) - 1), 2),
                    ],
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=Path("results/profiler-idle-check"))
    ap.add_argument("--threshold-pct", type=float, default=5.0)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--json", type=Path, help="also write the table here")
    a = ap.parse_args()
    if not (a.results / "raw").is_dir():
        sys.exit(f"{a.results}/raw: no measured points; run the experiment first (see --help)")
    rows = pairs_table(a.results, a.threshold_pct, a.alpha)
    if not rows:
        sys.exit(f"{a.results}: no configuration X measured beside X{SUFFIX}")
    print(
        f"{'config':<16} {'c':>3} {'metric':<18} {'n':>2} {'diff %':>7} {'agree':>5} "
        f"{'p':>7}  verdict"
    )
    for r in rows:
        diff = "" if r["profiler_vs_plain_pct"] is None else f"{r['profiler_vs_plain_pct']:+.2f}"
        p = "" if r["p_value"] is None else f"{r['p_value']:.4f}"
        print(
            f"{r['server_config']:<16} {r['concurrency']:>3} {r['metric']:<18} {r['n']:>2} "
            f"{diff:>7} {r['agree']:>5} {p:>7}  {r['verdict']}"
        )
    real = [r for r in rows if r["verdict"] in ("a > b", "a < b")]
    tp = [r for r in rows if r["metric"] == "output_throughput" and r["profiler_vs_plain_pct"]]
    mean_tp = sum(float(r["profiler_vs_plain_pct"]) for r in tp) / len(tp) if tp else 0.0
    print(
        f"{len(real)} of {len(rows)} pairs differ (p < {a.alpha:g} and at least "
        f"{a.threshold_pct:g}%); throughput, profiler-configured against plain: "
        f"{mean_tp:+.2f}% on average over {len(tp)} points"
    )
    pool = pooled(a.results)
    print("pooled over the concurrencies and repeats (profiler-configured against plain):")
    for r in pool:
        lo, hi = r["ci95_pct"]  # type: ignore[misc]
        print(
            f"  {r['server_config']:<16} {r['metric']:<18} n={r['n']:<3} {r['ratio_pct']:+.2f}% "
            f"(95% CI {lo:+.2f}% to {hi:+.2f}%)"
        )
    if a.json:
        doc = {"pairs": rows, "pooled": pool}
        a.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
