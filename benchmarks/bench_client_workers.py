"""The client spread over worker processes (`workers=N`), against sse_fixture.py (or .c).

Part a (closed loop, as figure 3 measures a client): at concurrency 512, for each offered rate
(512 streams x --chunk-tokens tokens / step) and each client set-up (N workers on the cores
given), every token's arrival as the client recorded it against the fixture's send time (lag),
and each request's TTFT against the fixture's (first send - request received): the TTFT error;
and the fixture's own CPU per token. With --chunk-tokens K each write to a stream carries K SSE
events: the fixture's cost is mostly the kernel's per write, the client's per event, so K > 1
lets one fixture core offer more tokens/s than one client core can ingest, which is what a
second worker is for (--fixture c, the C twin of sse_fixture.py, leaves the most of its core).

Part b (open loop): constant arrivals at each --rates rate, each request --tokens tokens at the
fixture's --open-step-us: per client set-up, the schedule slip (send_slip_us, p50 and p99), the
achieved arrival rate and the client's CPU per request; the highest rate the host drives (every
request ok, achieved rate within 5% of the target, p99 slip at most --max-slip-ms); and
`vllm bench serve --request-rate R --burstiness inf` (constant arrivals) at the same rates, its
slip taken from its own schedule (its start time and delays, read inside its process) to its
request's start time.

Every client process runs pinned (`taskset`) to the cores its set-up names, the fixture to
--fixture-cpu. `--parts a` or `--parts b` runs one part; `--report-only` re-prints from --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


# --- inside the pinned client processes ---


def servelab_child(argv: list[str]) -> None:
    """closed BASE C N TOKENS WORKERS | open BASE RATE N TOKENS WORKERS: one point, as JSON."""
    from servelab.client import OpenLoop, RequestSettings, run_point
    from servelab.design.arrivals import ArrivalProcess

    kind, base = argv[0], argv[1]
    n, tokens, workers = int(argv[3]), int(argv[4]), int(argv[5])
    # warm up the process's own code paths first, as bench_ceiling.py does (not analysed)
    run_point(RequestSettings(base_url=base, model="fixture", max_tokens=16), ["x"] * 8, 8, "warm")
    w = RequestSettings(base_url=base, model="fixture", max_tokens=tokens)
    if kind == "closed":
        c = int(argv[2])
        pr = run_point(w, ["x"] * n, c, f"sl-w{workers}", workers=workers)
    else:
        plan = OpenLoop.of(ArrivalProcess("constant", float(argv[2])), n)
        pr = run_point(w, ["x"] * n, plan, f"sl-w{workers}", workers=workers)
    recs = [r.to_json() for r in pr.records]
    out = {"client_cpu_s": pr.client_cpu_s, "workers": pr.workers, "requests": recs,
           "started_epoch_ns": pr.started_epoch_ns}  # fmt: skip
    print(json.dumps(out))


def vllm_child() -> None:
    """In the vLLM venv: vllm_client_worker.py's jobs, each result with the schedule that
    `vllm bench serve` drew (its start, time.time(), and its gamma draws, if any)."""
    sys.path.insert(0, str(HERE))
    import numpy as np
    import vllm_client_worker as vw
    from vllm.benchmarks import serve

    seen: dict[str, list[float]] = {"time": [], "gamma": []}

    class Time:  # serve.py's `time`: time.time() calls recorded (its schedule's start)
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def time(self) -> float:
            t = time.time()
            seen["time"].append(t)
            return t

    class Random:
        def __getattr__(self, name: str) -> Any:
            return getattr(np.random, name)

        def gamma(self, shape: float, scale: float) -> float:
            g = float(np.random.gamma(shape=shape, scale=scale))
            seen["gamma"].append(g)
            return g

    class Np:
        random = Random()

        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

    serve.time = Time()  # type: ignore[assignment]
    serve.np = Np()  # type: ignore[assignment]
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        seen["time"].clear()
        seen["gamma"].clear()
        res = vw.run(json.loads(line)["argv"])
        res["schedule"] = {"start_ts": seen["time"][0], "gamma": list(seen["gamma"])}
        out.write(json.dumps(res) + "\n")
        out.flush()


def vllm_scheduled_ns(n: int, rate: float, sched: dict[str, Any]) -> list[int]:
    """Each request's scheduled send (epoch ns), as serve.py's get_request computes it."""
    gam = sched["gamma"]
    delays = list(gam) if gam else [1.0 / rate] * n
    for i in range(1, n):
        delays[i] += delays[i - 1]
    if delays[-1] != 0:
        factor = (n / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return [int((sched["start_ts"] + d) * 1e9) for d in delays]


# --- the parent ---


def pinned(cpus: str, args: list[str]) -> dict[str, Any]:
    """A client child under `taskset -c CPUS` (and `nice -n N` for a set-up's CPUS/nN)."""
    cores, _, nice = cpus.partition("/n")
    cmd = ["nice", "-n", nice or "0", "taskset", "-c", cores, sys.executable, __file__,
           "--child", *args]  # fmt: skip
    return dict(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), in seconds."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def setups(specs: list[str]) -> list[tuple[int, str]]:
    """'WORKERS@CPUS' or 'WORKERS@CPUS/nN' (the client at niceness N) -> (workers, cpus)."""
    out = []
    for s in specs:
        w, _, cpus = s.partition("@")
        out.append((int(w), cpus or "0"))
    return out


def part_a(a: argparse.Namespace) -> list[dict[str, Any]]:
    from _common import start_fixture
    from bench_ceiling import analyse, fetch_sends

    from servelab.launch.ports import free_port

    levels = []
    for step in a.steps_us:
        for rep in range(a.repeats):
            order = setups(a.setups) if rep % 2 == 0 else setups(a.setups)[::-1]
            for workers, cpus in order:
                port = free_port()
                fx = start_fixture(port, step, a.fixture_cpu, a.fixture, a.chunk_tokens)
                tokens = a.chunk_tokens * max(16, int(a.seconds / max(step, 250) * 1e6 / a.waves))
                n = a.waves * a.concurrency
                try:
                    fx_cpu0 = cpu_seconds(fx.pid)
                    res = pinned(cpus, ["closed", f"http://127.0.0.1:{port}", str(a.concurrency),
                                        str(n), str(tokens), str(workers)])  # fmt: skip
                    fixture_cpu_s = cpu_seconds(fx.pid) - fx_cpu0
                    sends = fetch_sends(port)
                finally:
                    fx.terminate()
                    fx.wait()
                m = analyse(res["requests"], sends)
                m.update(workers=workers, cpus=cpus, step_us=step, tokens_per_request=tokens,
                         requests_expected=n, client_cpu_s=res["client_cpu_s"],
                         worker_stats=res["workers"], fixture=a.fixture,
                         fixture_cpu_s=fixture_cpu_s,
                         offered_tok_s=a.concurrency * a.chunk_tokens * 1e6 / step
                         if step else None, chunk_tokens=a.chunk_tokens)  # fmt: skip
                levels.append(m)
                busy = ", ".join(f"{x['busy']:.2f}" for x in res["workers"])
                print(f"a: {workers} worker(s) @ {cpus:4s} step {step:6d} us: "
                      f"{m.get('rate_tok_s', 0):9.0f} tok/s, lag p99 {m.get('lag_p99_ms', 0):7.2f}"
                      f" ms, TTFT err {m.get('ttft_err_mean_ms', 0):6.2f} ms, bad "
                      f"{m['bad_requests']}, busy {busy}, fixture "
                      f"{fixture_cpu_s / max(1, m.get('tokens', 0)) * 1e6:.1f} us/token",
                      file=sys.stderr)  # fmt: skip
    return levels


def open_metrics(reqs: list[dict[str, Any]], slips_us: list[float], cpu_s: float,
                 sends_ns: list[int], rate: float) -> dict[str, Any]:  # fmt: skip
    sends_ns = sorted(sends_ns)
    span = (sends_ns[-1] - sends_ns[0]) / 1e9 if len(sends_ns) > 1 else 0.0
    return {
        "requests": len(reqs),
        "failed": sum(not r.get("ok") for r in reqs),
        "slip_p50_ms": _pct(slips_us, 0.5) / 1e3,
        "slip_p99_ms": _pct(slips_us, 0.99) / 1e3,
        "slip_max_ms": max(slips_us) / 1e3 if slips_us else float("nan"),
        "achieved_rate": (len(sends_ns) - 1) / span if span else 0.0,
        "target_rate": rate,
        "cpu_us_per_request": cpu_s / max(1, len(reqs)) * 1e6,
        "client_cpu_s": cpu_s,
    }


def open_servelab(a: argparse.Namespace, rate: float, workers: int, cpus: str) -> dict[str, Any]:
    from _common import start_fixture

    from servelab.launch.ports import free_port

    n = max(20, min(a.max_requests, int(rate * a.open_seconds)))
    port = free_port()
    fx = start_fixture(port, a.open_step_us, a.fixture_cpu, a.fixture)
    try:
        res = pinned(cpus, ["open", f"http://127.0.0.1:{port}", str(rate), str(n),
                            str(a.tokens), str(workers)])  # fmt: skip
    finally:
        fx.terminate()
        fx.wait()
    reqs = res["requests"]
    slips = [float(r["send_slip_us"]) for r in reqs]
    sends = [r["sent_epoch_ns"] + r["send_slip_us"] * 1000 for r in reqs]
    m = open_metrics(reqs, slips, res["client_cpu_s"], sends, rate)
    m.update(client="servelab", workers=workers, cpus=cpus, worker_stats=res["workers"])
    return m


def open_vllm(a: argparse.Namespace, rate: float, vllm: Any, model: Path) -> dict[str, Any]:
    from _common import start_fixture

    from servelab.launch.ports import free_port

    n = max(20, min(a.max_requests, int(rate * a.open_seconds)))
    port = free_port()
    fx = start_fixture(port, a.open_step_us, a.fixture_cpu, a.fixture)
    try:
        res = vllm.run([
            "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
            "--endpoint", "/v1/completions", "--model", "fixture", "--tokenizer", str(model),
            "--dataset-name", "random", "--random-input-len", "16",
            "--random-output-len", str(a.tokens), "--ignore-eos", "--request-rate", str(rate),
            "--burstiness", "inf", "--num-prompts", str(n), "--num-warmups", "0",
            "--ready-check-timeout-sec", "0", "--disable-tqdm", "--request-id-prefix", "vl-",
        ])  # fmt: skip
    finally:
        fx.terminate()
        fx.wait()
    reqs = res["requests"]
    due = vllm_scheduled_ns(n, rate, res["schedule"])
    slips = [(r["sent_epoch_ns"] - due[int(r["request_id"].rsplit("-", 1)[1])]) / 1e3
             for r in reqs]  # fmt: skip
    m = open_metrics(reqs, slips, res["client_cpu_s"], [r["sent_epoch_ns"] for r in reqs], rate)
    m.update(client="vllm", workers=1, cpus=str(a.vllm_cpu))
    return m


def drives(m: dict[str, Any], max_slip_ms: float) -> bool:
    """The client drove this rate: every request ok, the achieved rate within 5% of the target,
    p99 slip within the bound."""
    return (
        m["failed"] == 0
        and abs(m["achieved_rate"] / m["target_rate"] - 1) <= 0.05
        and m["slip_p99_ms"] <= max_slip_ms
    )


def part_b(a: argparse.Namespace) -> list[dict[str, Any]]:
    from _common import VllmClient, tiny_model, venv_python, workdir

    runs: list[dict[str, Any]] = []
    vllm = None
    if not a.no_vllm:
        vllm = VllmClient.__new__(VllmClient)
        cmd = ["taskset", "-c", str(a.vllm_cpu), venv_python(), __file__, "--vllm-child"]
        vllm.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )  # fmt: skip
    model = tiny_model(workdir())
    try:
        for rate in a.rates:
            for workers, cpus in setups(a.setups):
                runs.append(open_servelab(a, rate, workers, cpus))
                say_open(runs[-1])
            if vllm is not None:
                runs.append(open_vllm(a, rate, vllm, model))
                say_open(runs[-1])
    finally:
        if vllm is not None:
            vllm.close()
    return runs


def say_open(m: dict[str, Any]) -> None:
    print(f"b: {m['client']:8s} {m['workers']} worker(s) @ {m['cpus']:4s} {m['target_rate']:7.0f}"
          f" req/s: achieved {m['achieved_rate']:7.1f}, slip p50 {m['slip_p50_ms']:6.2f} p99 "
          f"{m['slip_p99_ms']:7.2f} ms, {m['cpu_us_per_request']:6.0f} us CPU/request, failed "
          f"{m['failed']}", file=sys.stderr)  # fmt: skip


def report(res: dict[str, Any], max_slip_ms: float) -> list[str]:
    out: list[str] = []
    levels = res.get("a", [])
    if levels:
        out.append(f"\nPart a (closed loop, concurrency {res['concurrency']}): worst over runs")
        out.append(f"{'step':>8} {'offered':>9} | {'set-up':>8} {'tok/s':>9} {'p99 lag':>8} "
                   f"{'TTFT err':>9} {'p99 err':>8} {'busy':>10}")  # fmt: skip
        keys = sorted({(m["step_us"], m["workers"], m["cpus"]) for m in levels},
                      key=lambda k: (k[0] == 0, -k[0], k[1], k[2]))  # fmt: skip
        for step, w, cpus in keys:
            ms = [m for m in levels if (m["step_us"], m["workers"], m["cpus"]) == (step, w, cpus)]
            ok = all(m["bad_requests"] == 0 and m["requests"] == m["requests_expected"]
                     for m in ms)  # fmt: skip
            busy = max(max(x["busy"] for x in m["worker_stats"]) for m in ms)
            out.append(
                f"{step / 1000:7g}ms {ms[0]['offered_tok_s'] or 0:9,.0f} | {w}@{cpus:>6} "
                f"{min(m.get('rate_tok_s', 0) for m in ms):9,.0f} "
                f"{max(m.get('lag_p99_ms', float('inf')) for m in ms):8.2f} "
                f"{max(abs(m.get('ttft_err_mean_ms', float('inf'))) for m in ms):9.2f} "
                f"{max(m.get('ttft_err_p99_abs_ms', float('inf')) for m in ms):8.2f} "
                f"{busy:10.2f}{'' if ok else ' !'}"
            )
    runs = res.get("b", [])
    if runs:
        out.append(f"\nPart b (open loop, constant arrivals; drives = no failure, rate within 5%, "
                   f"p99 slip <= {max_slip_ms:g} ms)")  # fmt: skip
        out.append(f"{'rate':>7} | {'client':>14} {'achieved':>9} {'slip p50':>9} {'p99':>8} "
                   f"{'CPU/req':>9} drives")  # fmt: skip
        best: dict[str, float] = {}
        for m in runs:
            who = f"{m['client']} {m['workers']}@{m['cpus']}"
            ok = drives(m, max_slip_ms)
            if ok:
                best[who] = max(best.get(who, 0.0), m["target_rate"])
            out.append(f"{m['target_rate']:7g} | {who:>14} {m['achieved_rate']:9.1f} "
                       f"{m['slip_p50_ms']:9.2f} {m['slip_p99_ms']:8.2f} "
                       f"{m['cpu_us_per_request']:7.0f}us {'yes' if ok else 'no'}")  # fmt: skip
        out.append("Highest rate driven: " + ", ".join(f"{k} {v:g} req/s" for k, v in best.items()))
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        servelab_child(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--vllm-child":
        vllm_child()
        return
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--parts", default="ab", help="a (closed loop), b (open loop), or ab")
    p.add_argument("--setups", nargs="+", default=["1@0", "2@0", "2@0-1"],
                   help="client set-ups, WORKERS@CPUS (taskset's core list), or "
                        "WORKERS@CPUS/nN: the client at niceness N (/n10: the fixture takes "
                        "its core first, as a server on its own hardware would)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=512, help="part a: streams open at once")
    p.add_argument("--steps-us", type=int, nargs="+", default=[20000, 10000, 7000, 4000],
                   help="part a: the fixture's step per level, in microseconds")  # fmt: skip
    p.add_argument("--waves", type=int, default=2, help="part a: requests = waves x concurrency")
    p.add_argument("--repeats", type=int, default=1, help="part a: runs per level and set-up")
    p.add_argument("--seconds", type=float, default=1.5, help="part a: about how long a level")
    p.add_argument("--rates", type=float, nargs="+", default=[250, 500, 1000, 2000],
                   help="part b: arrival rates, requests per second")  # fmt: skip
    p.add_argument("--tokens", type=int, default=8, help="part b: tokens per request")
    p.add_argument("--open-step-us", type=int, default=2000, help="part b: the fixture's step")
    p.add_argument("--open-seconds", type=float, default=2.0, help="part b: seconds of arrivals")
    p.add_argument("--max-requests", type=int, default=4000, help="part b: requests per run, most")
    p.add_argument("--max-slip-ms", type=float, default=10.0, help="part b: p99 slip bound")
    p.add_argument("--no-vllm", action="store_true", help="part b: without vllm bench serve")
    p.add_argument("--vllm-cpu", type=int, default=0, help="part b: vllm bench serve's core")
    p.add_argument("--fixture-cpu", type=int, default=(os.cpu_count() or 2) - 1,
                   help="the core the fixture runs on")  # fmt: skip
    p.add_argument("--chunk-tokens", type=int, default=1,
                   help="part a: tokens (SSE events) per write to a stream, so a fixture "
                        "core can offer more tokens/s than one client core ingests")  # fmt: skip
    p.add_argument("--fixture", choices=["py", "c"], default="py",
                   help="sse_fixture.py, or its C twin sse_fixture.c (built with cc; a fraction "
                        "of the CPU per chunk, so a small host's fixture core has room for a "
                        "client worker)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="results file (default $TMPDIR/servelab-bench/...)")  # fmt: skip
    p.add_argument("--report-only", action="store_true", help="re-print from --out")
    a = p.parse_args()
    if a.out is None:
        from _common import workdir

        a.out = workdir() / "client_workers.json"
    if a.report_only:
        res = json.loads(a.out.read_text())
    else:
        t0 = time.monotonic()
        res = {"config": {k: str(v) for k, v in vars(a).items()}, "concurrency": a.concurrency,
               "load_average": os.getloadavg()}  # fmt: skip
        if "a" in a.parts:
            res["a"] = part_a(a)
        if "b" in a.parts:
            res["b"] = part_b(a)
        res["seconds"] = time.monotonic() - t0
        a.out.write_text(json.dumps(res, sort_keys=True, indent=1) + "\n")
    lines = report(res, a.max_slip_ms)
    print("\n".join(lines))
    print(f"FIGURE client workers: {summary(res, a.max_slip_ms)}")


def summary(res: dict[str, Any], max_slip_ms: float) -> str:
    """One line: part a's TTFT error at its fastest level per set-up, part b's highest rates."""
    bits = []
    levels = res.get("a", [])
    if levels:
        fastest = min(m["step_us"] for m in levels)
        errs: dict[str, list[float]] = {}
        for m in levels:
            if m["step_us"] == fastest:
                errs.setdefault(f"{m['workers']}@{m['cpus']}", []).append(
                    abs(m.get("ttft_err_mean_ms", float("inf")))
                )
        bits.append(f"TTFT error at {fastest / 1000:g} ms steps, concurrency {res['concurrency']}: "
                    + ", ".join(f"{k} {max(v):.2f} ms" for k, v in errs.items()))  # fmt: skip
    runs = res.get("b", [])
    if runs:
        best: dict[str, float] = {}
        for m in runs:
            if drives(m, max_slip_ms):
                who = f"{m['client']} {m['workers']}@{m['cpus']}"
                best[who] = max(best.get(who, 0.0), m["target_rate"])
        bits.append("open loop driven up to " + ", ".join(f"{k} {v:g}" for k, v in best.items())
                    + " req/s")  # fmt: skip
    return "; ".join(bits) or "nothing measured"


if __name__ == "__main__":
    main()
