"""Run every benchmark in turn and print each figure as a ratio against its anchor.

    python benchmarks/run_all.py [--results results/quickstart-cpu]

Fits in about 10 minutes on a 2-core host (see benchmarks/README.md). Each benchmark is its own
process, so one that fails does not hide the others; their full output goes to stderr.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run(name: str, args: list[str]) -> tuple[str, int, list[str], float]:
    print(f"\n=== {name}: python {' '.join(args)}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    sys.stderr.write(p.stdout)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    figures = [ln for ln in lines if ln.startswith("FIGURE")]
    if not figures and lines and p.returncode == 0:  # bench_trace.py prints one summary line
        figures = [f"FIGURE 4 {name} (anchor: SQLite's own full scan): {lines[-1]}"]
    return name, p.returncode, figures, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--results",
        type=Path,
        default=ROOT / "results" / "quickstart-cpu",
        help="a finished experiment's results/<experiment> for the pipeline overhead",
    )
    ap.add_argument("--trace-kernels", type=int, default=5_000_000)
    a = ap.parse_args()
    b = "benchmarks/"
    jobs = [
        ("fidelity and client cost", [b + "bench_fidelity.py"]),
        ("client ceiling", [b + "bench_ceiling.py"]),
        ("client workers", [b + "bench_client_workers.py"]),
        ("trace analysis", [b + "bench_trace.py", "--kernels", str(a.trace_kernels),
                            "--repeat", "1"]),
    ]  # fmt: skip
    if (a.results / "benchmarks").is_dir():
        jobs.append(("pipeline overhead", [b + "bench_pipeline.py", str(a.results)]))
    t0 = time.monotonic()
    done = [run(name, args) for name, args in jobs]
    print(f"\nservelab benchmarks ({time.monotonic() - t0:.0f} s)")
    for name, rc, figures, secs in done:
        status = "" if rc == 0 else f"  [exit {rc}]"
        print(f"- {name} ({secs:.0f} s){status}")
        for f in figures:
            print(f"    {f}")
    if not (a.results / "benchmarks").is_dir():
        print(
            f"- pipeline overhead: skipped, no {a.results}/benchmarks "
            "(run `snakemake --cores all` first, or pass --results)"
        )
    sys.exit(max(rc for _, rc, _, _ in done))


if __name__ == "__main__":
    main()
