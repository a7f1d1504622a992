"""Figure 5: pipeline overhead of a finished experiment, from its own timing files.

Reads results/<experiment>/benchmarks/*.tsv (Snakemake's per-rule `benchmark:` files, wall
seconds in column `s`) and every measured point's window (raw/<config>/repNN/cNNNN/point.json:
finished_epoch_ns - started_epoch_ns). Overhead = the rules that are not measurement
(environment checks: model, runtime; analysis and figures; bundle) over the sum of the measured
windows. The sweep jobs' own time outside the windows (server start, prompts, warm-up, stop) and
the profiling pass are printed beside it, as fractions of the same denominator.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path


def rule_seconds(results: Path) -> dict[str, float]:
    out = {}
    for tsv in sorted((results / "benchmarks").glob("*.tsv")):
        with tsv.open(encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        out[tsv.stem] = sum(float(r["s"]) for r in rows)
    return out


def measured_windows(results: Path) -> float:
    total = 0.0
    for pj in sorted(results.glob("raw/*/rep*/c*/point.json")):
        p = json.loads(pj.read_text(encoding="utf-8"))
        if p.get("kind", "measured") == "measured" and p.get("status", "complete") == "complete":
            total += (p["finished_epoch_ns"] - p["started_epoch_ns"]) / 1e9
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results", type=Path, help="results/<experiment> of a finished run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rules = rule_seconds(a.results)
    windows = measured_windows(a.results)
    if not rules or windows <= 0:
        sys.exit(f"{a.results}: no benchmarks/*.tsv or no measured points; run the experiment")
    # the profile capture jobs measure; their trace analysis (profile-report-*) is pipeline
    capture = {k for k in rules if k.startswith("profile-") and not k.startswith("profile-report-")}
    sweep = sum(v for k, v in rules.items() if k.startswith("sweep-"))
    profile = sum(rules[k] for k in capture)
    pipeline = {k: v for k, v in rules.items() if not k.startswith("sweep-") and k not in capture}
    overhead = sum(pipeline.values())
    res = {
        "measured_windows_s": windows,
        "pipeline_rules_s": pipeline,
        "overhead_fraction": overhead / windows,
        "sweep_outside_windows_fraction": (sweep - windows) / windows,
        "profile_fraction": profile / windows,
    }
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"measured point windows: {windows:.1f} s (sweep jobs {sweep:.1f} s)")
    for k, v in pipeline.items():
        print(f"  {k:12s} {v:7.2f} s")
    print(f"  sweep jobs outside the windows (server start, prompts, warm-up, stop): "
          f"{sweep - windows:.1f} s = {res['sweep_outside_windows_fraction']:.1%}")  # fmt: skip
    print(f"  profiling pass: {profile:.1f} s = {res['profile_fraction']:.1%}")
    print(f"FIGURE 5 pipeline overhead: {overhead:.2f} s / {windows:.1f} s = "
          f"{res['overhead_fraction']:.2%} of measurement (goal < 10%)")  # fmt: skip


if __name__ == "__main__":
    main()
