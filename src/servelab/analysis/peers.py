"""The result files of other serving benchmarks, each read by one small adapter into the
per-request lists of `vllm bench serve --save-detailed` (BenchJson), which servelab's
reader of vllm-bench trees already turns into points with its own definitions
(servelab.analysis.benchtree.vllm_bench_metrics): a tree of `rep_<NN>/concurrency_<CCC>/` or
`rep_<NN>/rate_<R>/` folders may hold, per point, any one of

- `benchmark.json`: vllm bench serve's (`--save-result --save-detailed`);
- `profile_export.jsonl` with `profile_export_aiperf.json` beside it: an AIPerf 0.13 run
  (`--export-level records`, its per-request records and its summary);
- `benchmarks.json`: a GuideLLM 0.8 run of one benchmark (`--output kind=json`);
- `per_request_lifecycle_metrics.json` with inference-perf's stage report and summary beside
  it: an inference-perf 0.7 run of one stage (`report.request_lifecycle.per_request`).

Each format is pinned by the version that wrote it (AIPerf's `aiperf_version`, GuideLLM's
`metadata.guidellm_version`; inference-perf records none, so its stage report's format
`version`): another version or layout is refused in one line naming the
file and what was expected. docs/analysis.md ("Other tools' results") maps each tool's fields
onto the lists, field by field: every tool here times TTFT to the first chunk that carries
text, as servelab does, and its output counts are the server's where it records them, never
a re-tokenization of the text."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path

from servelab.analysis.validity.facts import BenchJson
from servelab.errors import ServelabError
from servelab.store.jsonio import DamagedFile, read_json

# the file that holds a point's results, for each tool that writes one (in the order looked for)
POINT_FILES = (
    ("benchmark.json", "vllm"),
    ("profile_export.jsonl", "aiperf"),
    ("benchmarks.json", "guidellm"),
    ("per_request_lifecycle_metrics.json", "inference-perf"),
)
AIPERF_SUMMARY = "profile_export_aiperf.json"
# inference-perf records no version of its own: its stage report's format version is pinned
INFERENCE_PERF_REPORT = "inference-perf.partial.stage_0.yaml"
INFERENCE_PERF_SUMMARY = "summary_lifecycle_metrics.json"
# the versions whose layout each adapter reads (major.minor)
AIPERF_VERSION = "0.13"
GUIDELLM_VERSION = "0.8"
INFERENCE_PERF_FORMAT = "0.2"  # the report format inference-perf 0.7 writes


def client_output_tokens(bench: BenchJson) -> int:
    """A tool's own count of the output tokens of the requests that completed (no error, and
    output by the server's count)."""
    own = bench.get("client_output_lens") or []
    errors = bench.get("errors") or [""] * len(own)
    return sum(
        int(c or 0)
        for c, e, n in zip(own, errors, bench["output_lens"], strict=True)
        if not e and n not in (0, None)
    )


def point_file(folder: Path) -> tuple[Path, str] | None:
    """The results file of a point folder and the tool that wrote it (None: none known)."""
    for name, tool in POINT_FILES:
        if (folder / name).is_file():
            return folder / name, tool
    return None


def read_point(path: Path, tool: str) -> BenchJson:
    """A point's results as vllm bench's per-request lists."""
    if tool == "aiperf":
        return read_aiperf(path)
    if tool == "guidellm":
        return read_guidellm(path)
    if tool == "inference-perf":
        return read_inference_perf(path)
    data: BenchJson = read_json(path)
    return data


def tool_version(path: Path, tool: str) -> str | None:
    """The tool and version a point's file records ("aiperf 0.13.0"); None for vllm bench's,
    which records none."""
    if tool == "aiperf":
        return f"aiperf {_aiperf_summary(path).get('aiperf_version')}"
    if tool == "guidellm":
        meta = _mapping(read_json(path), "metadata")
        return f"guidellm {meta.get('guidellm_version')}"
    if tool == "inference-perf":
        return f"inference-perf (report format {_inference_perf_format(path)})"
    return None


def _mapping(d: object, key: str) -> Mapping[str, object]:
    v = d.get(key) if isinstance(d, Mapping) else None
    return v if isinstance(v, Mapping) else {}


def _number(d: Mapping[str, object], key: str) -> float | None:
    """An AIPerf record's metric ({"value": x, "unit": u}), its summary's ({"avg": x, ...}), or
    a plain number; else None."""
    v = d.get(key)
    if isinstance(v, Mapping):
        v = v.get("value", v.get("avg"))
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _pinned(path: Path, tool: str, found: object, wanted: str) -> None:
    if not (isinstance(found, str) and (found == wanted or found.startswith(wanted + "."))):
        raise ServelabError(
            f"{path}: written by {tool} {found}; servelab reads {tool} {wanted}.x results "
            f'(docs/analysis.md, "Other tools\' results"): rerun with {tool} {wanted}'
        )


# --- AIPerf ---------------------------------------------------------------------------------


def _aiperf_summary(records: Path) -> Mapping[str, object]:
    summary = records.with_name(AIPERF_SUMMARY)
    if not summary.is_file():
        raise ServelabError(
            f"{records}: no {AIPERF_SUMMARY} beside it; keep AIPerf's artifact folder whole"
        )
    data = read_json(summary)
    if not isinstance(data, Mapping):
        raise DamagedFile(summary, "$", "not a JSON object")
    _pinned(summary, "aiperf", data.get("aiperf_version"), AIPERF_VERSION)
    return data


def read_aiperf(records: Path) -> BenchJson:
    """An AIPerf 0.13 run: its per-request records (profile_export.jsonl, in completion order:
    sorted here by send) and its summary's duration."""
    summary = _aiperf_summary(records)
    rows: list[tuple[int, Mapping[str, object], Mapping[str, object], object]] = []
    for lineno, line in enumerate(records.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DamagedFile(records, f"line {lineno}", f"not JSON ({exc.msg})") from None
        meta, metrics = _mapping(rec, "metadata"), _mapping(rec, "metrics")
        start = meta.get("request_start_ns")
        if not isinstance(start, int):
            raise DamagedFile(records, f"line {lineno}", "metadata.request_start_ns: missing")
        rows.append((start, meta, metrics, rec.get("error")))
    if not rows:
        raise DamagedFile(records, "$", "no request record")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    out: BenchJson = {
        "ttfts": [], "itls": [], "latencies": [], "output_lens": [], "input_lens": [],
        "errors": [], "start_times": [], "client_output_lens": [], "client_waits": [],
    }  # fmt: skip
    for start, meta, metrics, error in rows:
        failed = error is not None
        chunks = metrics.get("inter_chunk_latency")
        gaps = chunks.get("value") if isinstance(chunks, Mapping) else None
        outs = _number(metrics, "usage_completion_tokens")
        if outs is None:
            outs = _number(metrics, "output_sequence_length")
        ins = _number(metrics, "usage_prompt_tokens") or _number(metrics, "input_sequence_length")
        first = _number(metrics, "time_to_first_token")
        out["ttfts"].append(0.0 if failed else None if first is None else first / 1e3)
        out["itls"].append(
            [float(g) / 1e3 for g in gaps] if isinstance(gaps, list) and not failed else []
        )
        out["latencies"].append(0.0 if failed else (_number(metrics, "request_latency") or 0) / 1e3)
        out["output_lens"].append(0 if failed or outs is None else int(outs))
        out["input_lens"].append(None if ins is None else int(ins))
        out["errors"].append(_error_text(error) if failed else "")
        out["start_times"].append((start - t0) / 1e9)
        own = _number(metrics, "output_sequence_length")
        out["client_output_lens"].append(None if own is None else int(own))
        credit = meta.get("credit_issued_ns")  # the slot's credit, before the send
        out["client_waits"].append((start - credit) / 1e9 if isinstance(credit, int) else None)
    duration = _number(summary, "benchmark_duration")
    if duration is None:
        raise DamagedFile(records.with_name(AIPERF_SUMMARY), "benchmark_duration", "missing")
    out["duration"] = duration
    out.update(_aiperf_load(summary))
    return out


# how each arrival process is recorded in a BenchJson: vllm bench's gamma shape `burstiness`
# (1: Poisson; infinite: constant gaps)
BURSTINESS = {"poisson": 1.0, "constant": math.inf}


def _aiperf_load(summary: Mapping[str, object]) -> BenchJson:
    """The profiling phase's load as the summary's input_config records it: its rate and
    arrival process (poisson, gamma of shape `smoothness`, constant) and its cap on requests
    in flight (`concurrency`), or that it sent on the send times of its dataset (a
    fixed_schedule phase); nothing more for a closed loop or another phase type."""
    phases = _mapping(summary, "input_config").get("phases")
    listed = phases if isinstance(phases, list) else []
    phase: Mapping[str, object] = next(
        (ph for ph in listed if isinstance(ph, Mapping) and ph.get("kind") == "profiling"), {}
    )
    kind, cap = phase.get("type"), phase.get("concurrency")
    out: BenchJson = {"max_concurrency": cap if isinstance(cap, int) else None}
    rate = _number(phase, "rate")
    if kind == "fixed_schedule":
        out["fixed_schedule"] = True
    elif kind == "gamma":
        out["burstiness"] = _number(phase, "smoothness") or 1.0
    elif isinstance(kind, str) and kind in BURSTINESS:
        out["burstiness"] = BURSTINESS[kind]
    if "burstiness" in out and rate is not None:
        out["request_rate"] = rate
    return out


def _error_text(error: object) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("type") or "error")
    return str(error) or "error"


# --- GuideLLM -------------------------------------------------------------------------------


def read_guidellm(path: Path) -> BenchJson:
    """A GuideLLM 0.8 run of one benchmark: its successful, errored and incomplete requests
    (sorted by send) and the benchmark's duration; a file of several benchmarks (a sweep) is
    refused: one point per folder."""
    data = read_json(path)
    _pinned(path, "guidellm", _mapping(data, "metadata").get("guidellm_version"), GUIDELLM_VERSION)
    benchmarks = data.get("benchmarks") if isinstance(data, Mapping) else None
    if not isinstance(benchmarks, list) or len(benchmarks) != 1:
        n = len(benchmarks) if isinstance(benchmarks, list) else 0
        raise ServelabError(
            f"{path}: {n} benchmarks; a point folder holds one (run GuideLLM once per "
            "concurrency or rate, each into rep_<NN>/concurrency_<CCC>/)"
        )
    bench = benchmarks[0]
    reqs = _mapping(bench, "requests")
    rows: list[tuple[float, Mapping[str, object], bool]] = []
    for kind in ("successful", "errored", "incomplete"):
        listed = reqs.get(kind)
        for r in listed if isinstance(listed, list) else []:
            if isinstance(r, Mapping):
                rows.append((_number(r, "request_start_time") or 0.0, r, kind != "successful"))
    if not rows:
        raise DamagedFile(path, "benchmarks[0].requests", "no request")
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    out: BenchJson = {
        "ttfts": [], "itls": [], "latencies": [], "output_lens": [], "input_lens": [],
        "errors": [], "start_times": [], "client_waits": [],
    }  # fmt: skip
    for start, r, failed in rows:
        outs = int(_number(r, "output_tokens") or 0)
        itl = _number(r, "inter_token_latency_ms")
        # a request whose output carried no text has no first token in GuideLLM's record
        first = _number(r, "time_to_first_token_ms")
        out["ttfts"].append(0.0 if failed else None if first is None else first / 1e3)
        out["itls"].append([] if failed or itl is None else [itl / 1e3] * max(0, outs - 1))
        out["latencies"].append(0.0 if failed else _number(r, "request_latency") or 0.0)
        out["output_lens"].append(0 if failed else outs)
        prompt = _number(r, "prompt_tokens")
        out["input_lens"].append(None if prompt is None else int(prompt))
        error = _mapping(r, "info").get("error")
        out["errors"].append(str(error or "incomplete") if failed else "")
        out["start_times"].append(start - t0)
        # the time from when the harness meant to send it (a free slot) to its send
        out["client_waits"].append(_number(r, "request_dispatch_delay"))
    duration = _number(bench, "duration") if isinstance(bench, Mapping) else None
    if duration is None:
        raise DamagedFile(path, "benchmarks[0].duration", "missing")
    out["duration"] = duration
    strategy = _mapping(_mapping(bench, "config"), "strategy")
    out.update(_guidellm_load(strategy, len(rows)))
    return out


def _guidellm_load(strategy: Mapping[str, object], requests: int) -> BenchJson:
    """The benchmark's load as its strategy records it: a concurrent one's `streams`, or a
    poisson or constant one's `rate` and cap on requests in flight (`max_concurrency`; GuideLLM
    sets one of 10,240 where none was asked: a cap of at least the benchmark's requests holds
    none back, and reads as none)."""
    kind = strategy.get("type_")
    if kind == "concurrent":
        streams = strategy.get("streams")
        return {"max_concurrency": streams if isinstance(streams, int) else None}
    cap = strategy.get("max_concurrency")
    out: BenchJson = {"max_concurrency": cap if isinstance(cap, int) and cap < requests else None}
    rate = _number(strategy, "rate")
    if isinstance(kind, str) and kind in BURSTINESS and rate is not None:
        out["burstiness"] = BURSTINESS[kind]
        out["request_rate"] = rate
    return out


# --- inference-perf -------------------------------------------------------------------------


def _inference_perf_format(path: Path) -> str:
    """The format version of the stage report beside a per-request file (`version: 0.2.1`)."""
    report = path.with_name(INFERENCE_PERF_REPORT)
    if not report.is_file():
        raise ServelabError(
            f"{path}: no {INFERENCE_PERF_REPORT} beside it; keep inference-perf's report folder "
            "whole (one stage per point folder)"
        )
    for line in report.read_text(encoding="utf-8").splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip("'\"")
    return "none"


def read_inference_perf(path: Path) -> BenchJson:
    """An inference-perf 0.7 stage: its per-request lifecycle records (sorted by send; times on
    the client's monotonic clock), each chunk's arrival for the ITLs, the server's usage for
    the lengths, and the run's time from the summary beside it."""
    _pinned(path, "inference-perf report format", _inference_perf_format(path),
            INFERENCE_PERF_FORMAT)  # fmt: skip
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise DamagedFile(path, "$", "not a list of request records")
    rows = sorted(
        (r for r in data if isinstance(r, Mapping)), key=lambda r: _number(r, "start_time") or 0
    )
    t0 = _number(rows[0], "start_time") or 0.0
    out: BenchJson = {
        "ttfts": [], "itls": [], "latencies": [], "output_lens": [], "input_lens": [],
        "errors": [], "start_times": [], "client_output_lens": [],
    }  # fmt: skip
    for r in rows:
        computed = _mapping(r, "computed_metrics")
        response = _mapping(_mapping(r, "info"), "response_metrics")
        usage = _mapping(response, "server_usage")
        error = r.get("error")
        failed = error is not None or not computed
        chunks = response.get("chunk_times")
        times = [float(t) for t in chunks] if isinstance(chunks, list) else []
        outs = _number(usage, "completion_tokens") or _number(computed, "output_tokens") or 0
        ins = _number(usage, "prompt_tokens") or _number(computed, "input_tokens")
        out["ttfts"].append(0.0 if failed else _number(computed, "time_to_first_token"))
        out["itls"].append([] if failed else [b - a for a, b in itertools.pairwise(times)])
        out["latencies"].append(0.0 if failed else _number(computed, "request_latency") or 0.0)
        out["output_lens"].append(0 if failed else int(outs))
        out["input_lens"].append(None if ins is None else int(ins))
        message = _mapping(r, "error").get("error_msg") if isinstance(error, Mapping) else error
        out["errors"].append(str(message or "no metrics") if failed else "")
        out["start_times"].append((_number(r, "start_time") or t0) - t0)
        own = _number(computed, "output_tokens")
        out["client_output_lens"].append(None if own is None else int(own))
    summary = path.with_name(INFERENCE_PERF_SUMMARY)
    doc = read_json(summary) if summary.is_file() else None
    took = _number(doc, "benchmark_time_seconds") if isinstance(doc, Mapping) else None
    ends = [_number(r, "end_time") or t0 for r in rows]
    out["duration"] = took if took is not None else max(ends) - t0
    out["max_concurrency"] = None
    return out
