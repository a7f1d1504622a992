"""What a vLLM server's log says about it: the capacity facts it prints at startup (KV cache,
maximum concurrency, non-default arguments, version, CUDA graph capture sizes) and where its
start went (its phases, the compile cache's outcome, the durations vLLM reports itself).

Pure text parsing, no process control: the server (servelab.launch.server) reads its starting log
with these while it waits for /health, and the analysis reads the logs of a finished run.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from servelab.documents.declared import PhaseTiming, StartRecord

# --- capacity facts from the startup log -------------------------------------------------

_NUM = r"([\d,]+(?:\.\d+)?)"
_KV_RE = re.compile(r"\b(CPU|GPU|XPU|TPU)?\s*KV cache size:\s*" + _NUM + r"\s*tokens", re.I)
_MAXCONC_RE = re.compile(
    r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request:\s*" + _NUM + r"\s*x", re.I
)
_NONDEFAULT_RE = re.compile(r"non-default args:\s*(\{.*\})")
_VERSION_RE = re.compile(r"(?:vLLM API server version|version)\s+v?(\d+\.\d+\.\d+\S*)")
# The CUDA graph capture sizes the engine used. vLLM prints its whole configuration when the
# engine starts ("Initializing a V1 LLM engine (vX) with config: ... compilation_config=...");
# the compilation config is JSON in 0.6-0.10 (`"cudagraph_capture_sizes":[256,248,...,1]`,
# largest first) and a Python dict in later versions (`'cudagraph_capture_sizes': [1, 2, 4]`,
# `'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>`). A server started with
# --cudagraph-metrics prints `- Capture sizes: [1, 2, 4]` with its statistics; a later warning
# "Capping cudagraph capture sizes from max 512 to 352" drops the sizes above the cap.
_COMPILATION_RE = re.compile(r"compilation_config=\{")
_CAPTURE_SIZES_RE = re.compile(
    r"""['"]cudagraph_capture_sizes['"]\s*:\s*(\[[\d,\s]*\]|None|null)"""
)
_CUDAGRAPH_MODE_RE = re.compile(
    r"""['"]cudagraph_mode['"]\s*:\s*(?:<CUDAGraphMode\.(\w+)|['"](\w+)['"])"""
)
_METRICS_SIZES_RE = re.compile(r"- Capture sizes:\s*(\[[\d,\s]*\])")
_METRICS_MODE_RE = re.compile(r"- Mode:\s*(\w+)")
_CAPPING_RE = re.compile(r"Capping cudagraph capture sizes from max (\d+) to (\d+)")
# "...is not supported with spec-decode for attention backend ...; setting cudagraph_mode=PIECEWISE"
_MODE_SET_RE = re.compile(r"setting cudagraph_mode=(\w+)")


class CaptureSizes(TypedDict):
    """The CUDA graph capture sizes a start's log says (`parse_capture_sizes`)."""

    cudagraph_capture_sizes: list[int] | None
    cudagraph_capture_sizes_source: str | None
    cudagraph_capture_sizes_capped_to: int | None
    cudagraph_mode: str | None


class _LogCapacity(TypedDict):
    kv_cache_tokens: int | None
    kv_cache_device: str | None
    max_concurrency: float | None
    max_concurrency_tokens_per_request: int | None
    non_default_args: dict[str, object] | None
    version: str | None


class CapacityFacts(_LogCapacity, CaptureSizes):
    """What a server's startup log says of its capacity (`parse_capacity`; capacity.json)."""


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _args_dict(text: str) -> dict[str, object] | None:
    """vLLM's `non-default args: {...}` as a dict: each literal value as it is, a value that is
    not a literal (the repr of a config object, e.g. `ProfilerConfig(profiler='torch', ...)`
    for --profiler-config) as its text; None when the text is not a dict with literal keys."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Dict):
        return None
    out: dict[str, object] = {}
    for k, v in zip(node.keys, node.values, strict=True):
        try:
            key = ast.literal_eval(k) if k is not None else None
        except ValueError:
            return None
        if key is None:
            return None
        try:
            value: object = ast.literal_eval(v)
        except ValueError:
            value = ast.get_source_segment(text, v)
        out[str(key)] = _jsonable(value)
    return out


def parse_capacity(log_text: str) -> CapacityFacts:
    """Facts the server prints about itself at startup. Absent facts are None, never guessed.

    Handles the CPU form ("CPU KV cache size: N tokens, Maximum concurrency for L tokens per
    request: Xx" on one line) and the GPU form, which some versions print on two lines.
    """
    facts: _LogCapacity = {
        "kv_cache_tokens": None,
        "kv_cache_device": None,
        "max_concurrency": None,
        "max_concurrency_tokens_per_request": None,
        "non_default_args": None,
        "version": None,
    }
    for m in _KV_RE.finditer(log_text):
        facts["kv_cache_tokens"] = int(_num(m.group(2)))
        facts["kv_cache_device"] = (m.group(1) or "").upper() or None
    for m in _MAXCONC_RE.finditer(log_text):
        facts["max_concurrency_tokens_per_request"] = int(_num(m.group(1)))
        facts["max_concurrency"] = _num(m.group(2))
    for m in _NONDEFAULT_RE.finditer(log_text):
        args = _args_dict(m.group(1))
        if args is not None:
            facts["non_default_args"] = args
    for m in _VERSION_RE.finditer(log_text):
        facts["version"] = m.group(1)
        break
    return {**facts, **parse_capture_sizes(log_text, facts["non_default_args"])}


def _size_list(text: str) -> list[int] | None:
    if text in ("None", "null"):
        return None
    return sorted({int(x) for x in re.findall(r"\d+", text)})


def parse_capture_sizes(
    log_text: str, non_default_args: Mapping[str, object] | None
) -> CaptureSizes:
    """The CUDA graph capture sizes the engine used, ascending (`cudagraph_capture_sizes`;
    [] when it captured none, None when the log does not say), where they were read
    (`cudagraph_capture_sizes_source`: `compilation_config` from the engine's configuration,
    `cudagraph_metrics`, or `non_default_args`: only what was asked for), the cap a later
    warning applied (`cudagraph_capture_sizes_capped_to`) and `cudagraph_mode` (NONE,
    PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE, as a later warning left it; None
    when not printed)."""
    sizes: list[int] | None = None
    source: str | None = None
    mode: str | None = None
    for line in log_text.splitlines():
        start = _COMPILATION_RE.search(line)
        if start is None:
            continue
        rest = line[start.end() :]
        m = _CAPTURE_SIZES_RE.search(rest)
        if m is not None:
            sizes, source = _size_list(m.group(1)), "compilation_config"
        mm = _CUDAGRAPH_MODE_RE.search(rest)
        if mm is not None:
            mode = mm.group(1) or mm.group(2)
    if source is None:
        for m in _METRICS_SIZES_RE.finditer(log_text):
            sizes, source = _size_list(m.group(1)), "cudagraph_metrics"
        for m in _METRICS_MODE_RE.finditer(log_text):
            mode = mode or m.group(1)
    if source is None and non_default_args:
        asked = non_default_args.get("cudagraph_capture_sizes")
        cc = non_default_args.get("compilation_config")
        if asked is None and isinstance(cc, Mapping):
            asked = cc.get("cudagraph_capture_sizes")
        asked_ints = [x for x in asked if isinstance(x, int)] if isinstance(asked, list) else []
        if isinstance(asked, list) and len(asked_ints) == len(asked):
            sizes, source = sorted(set(asked_ints)), "non_default_args"
    for m in _MODE_SET_RE.finditer(log_text):
        mode = m.group(1)
    capped: int | None = None
    for m in _CAPPING_RE.finditer(log_text):
        capped = int(m.group(2))
    if capped is not None and sizes is not None:
        sizes = [x for x in sizes if x <= capped]
    return {
        "cudagraph_capture_sizes": sizes,
        "cudagraph_capture_sizes_source": source,
        "cudagraph_capture_sizes_capped_to": capped,
        "cudagraph_mode": mode,
    }


def _jsonable(v: object) -> object:
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


# --- where a start goes: its phases, from the log ----------------------------------------

# A line in vLLM's log format: `(APIServer pid=1) INFO 12-02 07:52:14 [file.py:12] ...`, the
# process prefix only in V1. Its time has one-second resolution and no year.
_LOG_TIME_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)\b")


@dataclass(frozen=True)
class StartPhase:
    """A phase of a server start: it begins at the first log line that matches `starts` (at
    the process start for the first) and lasts until the next phase begins."""

    name: str
    what: str  # what happens in it (docs/raw-data.md)
    starts: re.Pattern[str] | None


# In the order vLLM's V1 engine goes through them; the patterns are the lines of vLLM 0.8 to
# 0.32, CPU and GPU (vllm/v1/engine/core.py, vllm/v1/worker/gpu_model_runner.py,
# vllm/compilation/), the earliest matching line of a phase marking its start.
START_PHASES: tuple[StartPhase, ...] = (
    StartPhase("import", "Python starts and imports vLLM", None),
    StartPhase(
        "config",
        "vLLM's first log line (the API server's banner) until the model's configuration is "
        "resolved",
        _LOG_TIME_RE,
    ),
    StartPhase(
        "engine",
        "the engine configuration is completed and the engine core process starts",
        re.compile(r"Resolved architecture"),
    ),
    StartPhase(
        "workers",
        "the engine core starts its workers (processes, distributed init)",
        re.compile(r"Initializing a V\d LLM engine"),
    ),
    StartPhase("load", "the weights load", re.compile(r"Starting to load model")),
    StartPhase(
        "compile",
        "torch.compile (on a GPU within the profiling run that follows the load)",
        re.compile(
            r"Warming up model for the compilation|Model loading took|"
            r"Using cache directory: .* for vLLM's torch\.compile|Dynamo bytecode transform time"
        ),
    ),
    StartPhase(
        "kv",
        "memory profiling and the KV cache's allocation",
        re.compile(
            r"torch\.compile (?:takes|took|and initial profiling run took) [\d.]+ s in total|"
            r"Initial profiling/warmup run took|Warming up done|Available KV cache memory"
        ),
    ),
    StartPhase(
        "warmup",
        "CUDA graph capture (GPU) and the engine's warm-up",
        re.compile(r"KV cache size:"),
    ),
    StartPhase(
        "api",
        "the API server sets up serving (tokenizer, chat template, routes)",
        re.compile(r"init engine (?:\(profile, create kv cache, warmup model\) )?took"),
    ),
    StartPhase(
        "http",
        "the HTTP server starts until /health answered (within one poll, 0.5 s)",
        re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on"),
    ),
)
PHASE_NAMES = tuple(p.name for p in START_PHASES)

# The compile cache's outcome: a load that failed and compiled again, a hit, or a miss.
_CACHE_FAILED_RE = re.compile(
    r"Compiling model again due to a load failure from .*?, reason: (.*)$"
)
_CACHE_HIT_RE = re.compile(
    r"Directly load (?:the compiled graph|AOT compilation)|Directly lookup the graph"
)
_CACHE_MISS_RE = re.compile(
    r"saved AOT compiled function|Compiling a graph for|Cache the graph (?:of|for)"
)
# Durations vLLM reports itself (its own clock).
_REPORTED_RES: dict[str, re.Pattern[str]] = {
    "load_weights": re.compile(r"Loading weights took ([\d.]+) ?s"),
    "model_loading": re.compile(r"Model loading took .*? and ([\d.]+) ?s"),
    "compile": re.compile(
        r"torch\.compile (?:takes|took|and initial profiling run took) ([\d.]+) s in total"
    ),
    "cudagraph_capture": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "init_engine": re.compile(
        r"init engine (?:\(profile, create kv cache, warmup model\) )?took ([\d.]+) ?s"
    ),
}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def start_phases(lines: Iterable[tuple[float, str]], ready_t_s: float | None) -> StartRecord:
    """Where a server start went, from its log lines, each with the seconds since the process
    started at which servelab first saw it (`t_s`; lines are read while /health is polled, so
    to within one poll).

    `phases`: every phase of START_PHASES in order, with `t_s` (when its first line was seen;
    0 for `import`), `log_time` (that line's own `MM-DD HH:MM:SS`, when it has one) and
    `duration_s` (until the next phase that was seen, the last until `ready_t_s`, when /health
    first answered 200). A phase whose line never appeared has nulls: its time counts in the
    phase before it. Never raises on a log it does not know. `compile_cache`: `hit`, `miss`,
    `load_failed` (a cached graph failed to load and the model was compiled again;
    `compile_cache_reason` says why) or null (no compilation line, e.g. enforce-eager).
    `vllm_reported_s`: durations vLLM logs itself (null where it does not)."""
    seen = list(lines)
    found: list[tuple[float, str | None] | None] = [(0.0, None)]
    cursor = 0
    for phase in START_PHASES[1:]:
        assert phase.starts is not None
        hit = None
        for i in range(cursor, len(seen)):
            if phase.starts.search(seen[i][1]):
                hit = i
                break
        if hit is None:
            found.append(None)
            continue
        cursor = hit
        m = _LOG_TIME_RE.search(seen[hit][1])
        found.append((seen[hit][0], m.group(1) if m else None))
    phases: list[PhaseTiming] = []
    for k, (phase, at) in enumerate(zip(START_PHASES, found, strict=True)):
        if at is None:
            phases.append({"phase": phase.name, "t_s": None, "log_time": None, "duration_s": None})
            continue
        later = [f[0] for f in found[k + 1 :] if f is not None]
        end = later[0] if later else ready_t_s
        phases.append(
            {
                "phase": phase.name,
                "t_s": _rounded(at[0]),
                "log_time": at[1],
                "duration_s": _rounded(None if end is None else max(0.0, end - at[0])),
            }
        )
    text = [line for _, line in seen]
    cache: str | None = None
    reason: str | None = None
    if any(_CACHE_MISS_RE.search(line) for line in text):
        cache = "miss"
    if any(_CACHE_HIT_RE.search(line) for line in text):
        cache = "hit"
    for line in text:
        m = _CACHE_FAILED_RE.search(line)
        if m is not None:
            cache, reason = "load_failed", m.group(1).strip()
            break
    reported: dict[str, float | None] = {}
    for name, rx in _REPORTED_RES.items():
        reported[name] = next(
            (float(m.group(1)) for line in text if (m := rx.search(line)) is not None), None
        )
    return {
        "phases": phases,
        "ready_t_s": _rounded(ready_t_s),
        "compile_cache": cache,
        "compile_cache_reason": reason,
        "vllm_reported_s": reported,
    }


def start_line(start: Mapping[str, object]) -> str:
    """One line for a start record: `start 44.1 s: import 7.0, config 7.2, ..., compile 22.0
    (cache miss), ...`; the phases that were not seen are left out."""
    ready = start.get("ready_t_s")
    parts = []
    phases = start.get("phases")
    for p in phases if isinstance(phases, list) else []:
        if not isinstance(p, Mapping) or p.get("duration_s") is None:
            continue
        text = f"{p['phase']} {p['duration_s']:.1f}"
        if p["phase"] == "compile" and start.get("compile_cache"):
            text += f" (cache {str(start['compile_cache']).replace('_', ' ')})"
        parts.append(text)
    head = f"start {ready:.1f} s" if isinstance(ready, int | float) else "start (not ready)"
    return head + (": " + ", ".join(parts) if parts else "")
