"""Diagnoses (diagnoses.json): what the tables say about the server's configuration, in
plain words with the evidence - serialized, KV headroom unused, a throughput dip, utilization
that misleads, points past the knee and dominated points."""

from __future__ import annotations

import math
from typing import Any

from servelab.analysis.dataset import Dataset
from servelab.analysis.groups import Groups
from servelab.analysis.stats import paired
from servelab.experiment import AnalysisSection

LINEAR_TOLERANCE = 1.25  # serialized: seconds per request may vary this much across levels


def _max_num_seqs(cap: dict[str, Any]) -> int | None:
    nd = cap.get("non_default_args") or {}
    for v in (nd.get("max_num_seqs"), cap.get("max_num_seqs")):
        if isinstance(v, int | float) and not isinstance(v, bool):
            return int(v)
    return None


def diagnoses(
    g: Groups,
    ds: Dataset,
    knees: list[dict[str, Any]],
    dominated: list[dict[str, Any]],
    analysis: AnalysisSection,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sc in g.configs:
        lv = [c for c in g.levels(sc) if g.mean(sc, c, "output_throughput") is not None]
        cap = ds.capacity.get(sc, {})
        means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
        flat = _flat_span(g, sc, lv, means, analysis)
        if flat is not None:
            mns = _max_num_seqs(cap)
            out.append(
                {
                    "kind": "serialized",
                    "server_config": sc,
                    "evidence": {**flat, "max_num_seqs": mns},
                    "suggestion": (
                        "the server handles one request at a time: throughput is flat and wall "
                        "time grows linearly with the number of requests; "
                        + (
                            f"--max-num-seqs is {mns}: raise it"
                            if mns is not None
                            else "check --max-num-seqs and the scheduler limits"
                        )
                    ),
                }
            )
        mns = _max_num_seqs(cap)
        maxconc = cap.get("max_concurrency")
        if mns is not None and isinstance(maxconc, int | float) and mns < math.floor(maxconc):
            out.append(
                {
                    "kind": "kv_headroom_unused",
                    "server_config": sc,
                    "evidence": {
                        "max_num_seqs": mns,
                        "max_concurrency": maxconc,
                        "tokens_per_request": cap.get("max_concurrency_tokens_per_request"),
                        "kv_cache_tokens": cap.get("kv_cache_tokens"),
                    },
                    "suggested_max_num_seqs": math.floor(maxconc),
                    "suggestion": (
                        f"the startup log says the KV cache fits {maxconc:g} sequences of "
                        f"{cap.get('max_concurrency_tokens_per_request')} tokens, but "
                        f"--max-num-seqs is {mns}; try --max-num-seqs {math.floor(maxconc)}"
                    ),
                }
            )
        dip = _dip(g, sc, lv, analysis)
        if dip is not None:
            nd = cap.get("non_default_args") or {}
            sizes = next((v for k, v in sorted(nd.items()) if "capture_sizes" in k), None)
            out.append(
                {
                    "kind": "non_monotonic",
                    "server_config": sc,
                    "concurrency": dip["concurrency"],
                    "capture_sizes": sizes,
                    "evidence": dip,
                    "suggestion": (
                        "throughput dips here and recovers at higher concurrency: avoid "
                        "this operating point (on GPUs, often a batch size outside the "
                        "captured CUDA graphs)"
                    ),
                }
            )
        out += _utilization_misleading(g, sc, lv, means)
    for k in knees:
        if k["concurrency"] is None:
            continue
        past = [c for c in g.levels(k["server_config"]) if c > k["concurrency"]]
        if past:
            out.append(
                {
                    "kind": "past_knee",
                    "server_config": k["server_config"],
                    "concurrency": past,
                    "evidence": {"knee": k["concurrency"], "reason": k["reason"]},
                    "suggestion": (
                        f"concurrency above {k['concurrency']} adds latency, not throughput"
                    ),
                }
            )
    for d in dominated:
        out.append(
            {
                "kind": "dominated",
                "server_config": d["server_config"],
                "concurrency": d["concurrency"],
                "evidence": d,
                "suggestion": (
                    f"concurrency {d['dominated_by']} is at least as good on "
                    "throughput, TTFT and TPOT: do not operate here"
                ),
            }
        )
    return out


def _flat_span(
    g: Groups, sc: str, lv: list[int], means: dict[int, float], analysis: AnalysisSection
) -> dict[str, Any] | None:
    """The widest run of consecutive levels spanning at least 4x in concurrency over which
    throughput varies less than flat_pct and seconds per request (duration / prompts) stay
    within LINEAR_TOLERANCE, i.e. wall time grows linearly with the number of requests."""
    best: dict[str, Any] | None = None
    for i in range(len(lv)):
        for j in range(len(lv) - 1, i, -1):
            span = lv[i : j + 1]
            if span[-1] / span[0] < 4:
                break
            tp = [means[c] for c in span]
            if min(tp) <= 0:
                continue
            spread = 100.0 * (max(tp) / min(tp) - 1)
            s_per_req = {
                c: (g.mean(sc, c, "duration") or 0.0)
                / max(1.0, g.mean(sc, c, "num_prompts") or 1.0)
                for c in span
            }
            lo, hi = min(s_per_req.values()), max(s_per_req.values())
            if spread < analysis.flat_pct and lo > 0 and hi / lo <= LINEAR_TOLERANCE:
                if (
                    best is None
                    or span[-1] / span[0]
                    > best["concurrency_span"][1] / best["concurrency_span"][0]
                ):
                    best = {
                        "throughput_spread_pct": spread,
                        "concurrency_span": [span[0], span[-1]],
                        "seconds_per_request": s_per_req,
                    }
                break
    return best


def _dip(g: Groups, sc: str, lv: list[int], analysis: AnalysisSection) -> dict[str, Any] | None:
    means = {c: g.mean(sc, c, "output_throughput") or 0.0 for c in lv}
    for i, c in enumerate(lv):
        lower = [d for d in lv[:i] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)]
        higher = [
            d for d in lv[i + 1 :] if means[d] > means[c] * (1 + analysis.threshold_pct / 100)
        ]
        if lower and higher:
            ref = max(lower, key=lambda d: means[d])
            va, vb = g.pair(sc, ref, sc, c, "output_throughput")
            test = paired(va, vb, analysis.threshold_pct, analysis.alpha)
            if test.verdict == "a > b":
                return {
                    "concurrency": c,
                    "throughput": means[c],
                    "lower_concurrency": ref,
                    "lower_throughput": means[ref],
                    "recovers_at": higher[0],
                    "agree": test.agree,
                    "p_value": test.p_value,
                }
    return None


def _utilization_misleading(
    g: Groups, sc: str, lv: list[int], means: dict[int, float]
) -> list[dict[str, Any]]:
    """Utilization >= 95% at points delivering under half the best throughput (needs telemetry)."""
    best = max(means.values(), default=0.0)
    hits = []
    for c in lv:
        utils = [float(v) for v in g.values(sc, c, "utilization_pct").values()]
        if utils and min(utils) >= 95.0 and best > 0 and means[c] < 0.5 * best:
            hits.append(
                {
                    "concurrency": c,
                    "utilization_pct": min(utils),
                    "output_throughput": means[c],
                    "best_throughput": best,
                }
            )
    if not hits:
        return []
    return [
        {
            "kind": "utilization_misleading",
            "server_config": sc,
            "concurrency": [h["concurrency"] for h in hits],
            "evidence": hits,
            "suggestion": "the device reads fully busy while delivering under half the best "
            "throughput: judge by tokens/s, not utilization",
        }
    ]
