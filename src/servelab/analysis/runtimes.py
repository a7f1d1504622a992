"""Runtimes compared within one run: is configuration B, on its own runtime (another vLLM
release, server.configs[].runtime), faster or slower than A here?

Where the run's server configurations ran on more than one runtime (launch.json's
`runtime_lock_sha256` or `runtime_image_digest` differ), the first configuration is the
reference and every configuration on another runtime is compared with it, at every level
both measured, repeat by repeat: B's repeat r against A's repeat r, the two measured in the
same round of an interleaved plan (sweep.repeats.interleave) or in the same position of the
two launches' balanced orders. Per metric (throughput, mean TTFT, mean TPOT): the ratio B / A
as the geometric mean of the repeats' ratios with its (1 - alpha) confidence interval
(Student's t on the log ratios, n - 1 degrees of freedom), the paired test's p
(servelab.analysis.stats.paired, the analysis's alpha and practical threshold) and the
answer: `faster`, `slower` (a throughput higher or lower, a latency lower or higher, the test
calling the difference real) or `no difference detected`. The report's "Runtimes compared"
section gives them; a run on one runtime has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from servelab.analysis.dataset import Dataset
from servelab.analysis.groups import Groups, hit_order, invalid_text
from servelab.analysis.stats import paired, paired_ratio_ci
from servelab.experiment import AnalysisSection
from servelab.store.paths import ExperimentPaths
from servelab.store.records import LaunchRecord

METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
HIGHER_IS_BETTER = frozenset({"output_throughput"})
FORMAT_VERSION = 1


class RuntimeIdJson(TypedDict):
    server_config: str
    runtime: str | None  # lock:<sha256> or image:<digest>; None where launch.json has neither
    vllm_version: str | None


class ComparedJson(TypedDict):
    level: int | float
    metric: str
    n: int
    ratio: float | None  # B / A, geometric mean over the paired repeats
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    answer: str  # faster | slower | no difference detected | not testable: ...


class PairJson(TypedDict):
    a: RuntimeIdJson
    b: RuntimeIdJson
    rows: list[ComparedJson]


class RuntimesJson(TypedDict):
    format_version: int
    axis: str
    alpha: float
    threshold_pct: float
    pairs: list[PairJson]


def runtime_ids(
    root: Path, configs: list[str], capacity: Mapping[str, Mapping[str, Any]]
) -> list[RuntimeIdJson]:
    """Each configuration's runtime (from its launch.json) and vLLM release (its capacity
    facts, as the dataset read them: none where capacity.json is missing or damaged)."""
    paths = ExperimentPaths(root)
    out: list[RuntimeIdJson] = []
    for sc in configs:
        launch = LaunchRecord.read_if_present(paths.launch(sc))
        facts = capacity.get(sc) or {}  # capacity.json (CapacityRecord.vllm_version's rule)
        version = facts.get("version_endpoint") or facts.get("version")
        lock = launch.get("runtime_lock_sha256") if launch else None
        digest = launch.get("runtime_image_digest") if launch else None
        runtime = f"lock:{lock}" if lock else f"image:{digest}" if digest else None
        out.append(
            {
                "server_config": sc,
                "runtime": runtime,
                "vllm_version": version if isinstance(version, str) else None,
            }
        )
    return out


def _row(
    g: Groups, a: str, b: str, level: int | float, metric: str, opts: AnalysisSection
) -> ComparedJson:
    vb, va = g.pair(b, level, a, level, metric)
    test = paired(vb, va, opts.threshold_pct, opts.alpha)
    hits = sorted(g.left_out(a, level, metric) + g.left_out(b, level, metric), key=hit_order)
    row: ComparedJson = {
        "level": level,
        "metric": metric,
        "n": test.n,
        "ratio": None,
        "ci_low": None,
        "ci_high": None,
        "p_value": test.p_value,
        "answer": "",
    }
    if hits:  # as paired.csv: the repeats that remain are not tested
        row["answer"], row["p_value"] = invalid_text(hits), None
        return row
    if test.p_value is None:
        row["answer"] = test.verdict
        return row
    ratio = paired_ratio_ci(vb, va, opts.alpha)
    if ratio is not None:
        row["ratio"], row["ci_low"], row["ci_high"] = ratio.value, ratio.low, ratio.high
    if test.verdict == "not significant":
        row["answer"] = "no difference detected"
    else:
        higher = test.verdict == "a > b"  # a is B here
        row["answer"] = "faster" if higher == (metric in HIGHER_IS_BETTER) else "slower"
    return row


def runtimes_compared(g: Groups, ds: Dataset, opts: AnalysisSection) -> RuntimesJson | None:
    """The comparison of the run's runtimes (None: every configuration ran on one)."""
    ids = runtime_ids(ds.root, list(g.configs), ds.capacity)
    if len({i["runtime"] for i in ids}) < 2:
        return None
    ref = ids[0]
    pairs: list[PairJson] = []
    for other in ids[1:]:
        if other["runtime"] == ref["runtime"]:
            continue
        a, b = ref["server_config"], other["server_config"]
        levels = [c for c in g.levels(a) if c in g.levels(b)]
        rows = [_row(g, a, b, c, m, opts) for c in levels for m in METRICS]
        pairs.append({"a": ref, "b": other, "rows": rows})
    return {
        "format_version": FORMAT_VERSION,
        "axis": g.axis,
        "alpha": opts.alpha,
        "threshold_pct": opts.threshold_pct,
        "pairs": pairs,
    }


def _release(i: RuntimeIdJson) -> str:
    version = f"vLLM {i['vllm_version']}" if i["vllm_version"] else "vLLM release not reported"
    return f"{i['server_config']} ({version})"


def _ratio_text(r: ComparedJson) -> str:
    if r["ratio"] is None:
        return "n/a"
    return f"{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def runtimes_section(doc: RuntimesJson | None, level_name: dict[int | float, str]) -> list[str]:
    """The report's "Runtimes compared" section (none for a run on one runtime)."""
    if doc is None:
        return []
    ci = f"{100 * (1 - doc['alpha']):g}%"
    lines = [
        "",
        "## Runtimes compared",
        "",
        f"Each configuration on another runtime against the first, repeat by repeat: B / A "
        f"with its {ci} confidence interval, the paired t-test on the log ratios (alpha "
        f"{doc['alpha']:g}, practical threshold {doc['threshold_pct']:g}%).",
    ]
    for pair in doc["pairs"]:
        a, b = _release(pair["a"]), _release(pair["b"])
        lines += ["", f"### Is {b} slower than {a}?", ""]
        thr = [r for r in pair["rows"] if r["metric"] == "output_throughput"]
        slower = [level_name[r["level"]] for r in thr if r["answer"] == "slower"]
        faster = [level_name[r["level"]] for r in thr if r["answer"] == "faster"]
        parts = [f"slower in throughput at {', '.join(slower)}"] if slower else []
        parts += [f"faster in throughput at {', '.join(faster)}"] if faster else []
        untested = [
            level_name[r["level"]]
            for r in thr
            if r["answer"].startswith(("not testable", "invalid"))
        ]
        rest = len(thr) - len(slower) - len(faster) - len(untested)
        if rest:
            where = f"any of {rest} levels" if rest == len(thr) else f"the other {rest}"
            parts.append(f"no difference in throughput detected at {where}")
        if untested:  # a validity check left too few paired repeats (the table says why)
            parts.append(f"not testable at {', '.join(untested)}")
        lead = "Yes" if slower else "No" if len(untested) < len(thr) else "Not answered"
        lines += [
            f"{lead}: " + "; ".join(parts) + ".",
            "",
            "| level | metric | n | B / A [CI] | p | answer |",
            "|---|---|---|---|---|---|",
        ]
        for r in pair["rows"]:
            p = "" if r["p_value"] is None else f"{r['p_value']:.3g}"
            lines.append(
                f"| {level_name[r['level']]} | {r['metric']} | {r['n']} | {_ratio_text(r)} "
                f"| {p} | {r['answer']} |"
            )
    return lines
