"""Figure 5: the default experiment's wall time against its measured windows, from a finished
experiment's own files.

Reads results/<experiment>/benchmarks/*.tsv (Snakemake's per-rule `benchmark:` files, wall
seconds in column `s`), every measured point's window (raw/<config>/repNN/cNNNN/point.json:
finished_epoch_ns - started_epoch_ns) and each server start (server/<config>/launch.json and
profile/<config>/capture.json: `ready_s`; a profiling pass on the sweep's own launch,
capture.json `launch: sweep`, has no start of its own, and its `job_wall_s` is counted as
profiling, not sweep). The figure is wall / windows, where wall is every stage's time but
first-run setup (runtime: creating the venv; model: building or fetching it),
server starts counted, time spent waiting for the host's measuring-server lock (another
invocation's) left out: what a user waits for, per second of measurement (goal: at most 1.5x
on a second run). The summary prints the same ratio (servelab.summary.wall_line). Beside it: the
server starts, the profiling pass, and the pipeline's own rules (analysis, bundle, ...) as a
fraction of the windows, the figure this benchmark reported before.
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


SETUP = ("runtime", "model")  # first-run setup, left out of the wall time


def lock_waits(results: Path) -> float:
    """Seconds the launches waited for the host's measuring-server lock (another invocation's
    time: lock.waited_s of launch.json and capture.json)."""
    total = 0.0
    for path in [*results.glob("server/*/launch.json"), *results.glob("profile/*/capture.json")]:
        lock = json.loads(path.read_text(encoding="utf-8")).get("lock") or {}
        total += float(lock.get("waited_s") or 0.0)
    return total


def start_seconds(results: Path) -> dict[str, float]:
    """Each server start's ready_s: `sweep-<sc>` (the latest launch) and `profile-<sc>`."""
    out = {}
    for kind, folder, name in (
        ("sweep", "server", "launch.json"),
        ("profile", "profile", "capture.json"),
    ):
        for path in sorted((results / folder).glob(f"*/{name}")):
            ready = json.loads(path.read_text(encoding="utf-8")).get("ready_s")
            if isinstance(ready, (int, float)):
                out[f"{kind}-{path.parent.name}"] = float(ready)
    return out


def sweep_captures(results: Path) -> float:
    """Seconds of the profiling passes that ran on their sweep's launch (capture.json
    `launch: sweep`, job_wall_s: the capture's own time inside the sweep job)."""
    total = 0.0
    for path in sorted(results.glob("profile/*/capture.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("launch") == "sweep":
            total += float(record.get("job_wall_s") or 0.0)
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
    # a profiling pass on its sweep's own launch (profile.launch) is part of that sweep job
    on_sweep = sweep_captures(a.results)
    sweep = sum(v for k, v in rules.items() if k.startswith("sweep-")) - on_sweep
    profile = sum(rules[k] for k in capture) + on_sweep
    pipeline = {k: v for k, v in rules.items() if not k.startswith("sweep-") and k not in capture}
    overhead = sum(pipeline.values())
    wall = sum(v for k, v in rules.items() if k not in SETUP) - lock_waits(a.results)
    starts = start_seconds(a.results)
    res = {
        "wall_s": wall,
        "wall_ratio": wall / windows,
        "server_starts_s": starts,
        "setup_s": {k: rules[k] for k in SETUP if k in rules},
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
    for k, v in starts.items():
        print(f"  server start {k:28s} {v:6.1f} s")
    print(f"  pipeline rules (not measuring): {overhead:.2f} s = {res['overhead_fraction']:.2%}")
    left = ", ".join(f"{k} {v:.1f} s" for k, v in res["setup_s"].items())
    print(f"FIGURE 5 wall time: {wall:.1f} s for {windows:.1f} s of measured windows = "
          f"{res['wall_ratio']:.2f}x (goal <= 1.5x on a second run; left out: {left})")  # fmt: skip


if __name__ == "__main__":
    main()
