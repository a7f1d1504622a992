"""Per-point metrics with the names and meaning of `vllm bench serve` (see docs/analysis.md).

Only successful requests count toward latencies; failures are counted in `failed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from servelab.client import RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def latency_stats(name: str, values_ms: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    arr = np.asarray(values_ms, dtype=np.float64)
    have = arr.size > 0
    out[f"mean_{name}_ms"] = float(arr.mean()) if have else None
    out[f"median_{name}_ms"] = float(np.median(arr)) if have else None
    out[f"std_{name}_ms"] = float(arr.std()) if have else None
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p)) if have else None
    return out


def request_latencies(rec: RequestRecord) -> dict[str, Any]:
    """TTFT, E2EL, TPOT and ITLs (ms) of one successful request."""
    offs = rec.chunk_offsets_us
    ttft = offs[0] / 1000.0
    e2el = (rec.done_offset_us if rec.done_offset_us is not None else offs[-1]) / 1000.0
    n = rec.output_tokens or 0
    tpot = (e2el - ttft) / (n - 1) if n > 1 else None
    itl = [(b - a) / 1000.0 for a, b in zip(offs, offs[1:], strict=False)]
    return {"ttft": ttft, "e2el": e2el, "tpot": tpot, "itl": itl}


def point_metrics(records: Iterable[RequestRecord]) -> dict[str, Any]:
    recs = list(records)
    good = [r for r in recs if r.ok and r.chunk_offsets_us]
    ttft, tpot, e2el, itl = [], [], [], []
    for r in good:
        lat = request_latencies(r)
        ttft.append(lat["ttft"])
        e2el.append(lat["e2el"])
        itl.extend(lat["itl"])
        if lat["tpot"] is not None:
            tpot.append(lat["tpot"])
    duration = 0.0
    if recs:
        start = min(r.sent_epoch_ns for r in recs)
        ends = [r.sent_epoch_ns + (r.done_offset_us or 0) * 1000 for r in good] or [start]
        duration = (max(ends) - start) / 1e9
    return assemble(
        num_prompts=len(recs),
        completed=len(good),
        duration=duration,
        total_input_tokens=sum(r.prompt_tokens or 0 for r in good),
        total_output_tokens=sum(r.output_tokens or 0 for r in good),
        latencies_ms={"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el},
    )


def assemble(
    num_prompts: int,
    completed: int,
    duration: float,
    total_input_tokens: int,
    total_output_tokens: int,
    latencies_ms: dict[str, list[float]],
) -> dict[str, Any]:
    """The metric keys of a point from its counts, duration (s) and latency lists (ms)."""
    dur = duration
    out: dict[str, Any] = {
        "num_prompts": num_prompts,
        "completed": completed,
        "failed": num_prompts - completed,
        "duration": dur,
        "total_input_tokens": total_input_tokens,
        "total_output_tokens": total_output_tokens,
        "request_throughput": completed / dur if dur > 0 else None,
        "output_throughput": total_output_tokens / dur if dur > 0 else None,
        "total_token_throughput": (total_input_tokens + total_output_tokens) / dur
        if dur > 0
        else None,
    }
    for name in LATENCIES:
        out.update(latency_stats(name, latencies_ms.get(name, [])))
    return out
