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
import sys
from collections import defaultdict
from pathlib import Path

from servelab.analysis.stats import paired
from servelab.rawdata import load_points

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
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
