"""The engine settings a vLLM server resolved: after its own defaults and its platform's logic,
not as the config asked for them (launch.json `engine`, docs/raw-data.md).

vLLM picks some settings by hardware: `max_num_seqs` and `max_num_batched_tokens` are 1024 and
8192 on a GPU of 70 GiB or more that is not an A100, 256 and 2048 on an A100, and others on a
CPU. Two runs of one config on two hosts can thus measure two different servers; only the
values the server resolved say which.

Where they come from, each value with its source:

- `engine`: the server is started through a small shim (`SHIM`, run with `python -c`) that
  wraps vLLM's `EngineArgs.create_engine_config` and prints the resolved scheduler, cache,
  model, compilation and parallel settings as one line, `SERVELAB_ENGINE_CONFIG {json}`, into
  the server's log, for a venv, a container or a cluster job alike. It needs no file of
  servelab's inside the runtime, and a vLLM whose config lacks a field gives null for it.
- `metrics`: the KV cache's blocks, known only once the engine has profiled its memory, from
  the server's `/metrics` info gauge `vllm:cache_config_info`.
- `log`: the attention backend, where the server's log names it ("Using X backend").

A server started before this record existed, or a server servelab did not launch, has none:
"effective configuration not recorded".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from servelab.documents import JsonObject, JsonValue
from servelab.documents.declared import EngineJson, Setting
from servelab.env.engine_shim import FIELDS, MARK

NOT_RECORDED = "effective configuration not recorded"

# the settings that shape how requests are scheduled: a difference in one of them, unpinned by
# the config, makes two runs' orderings and knees not comparable
SCHEDULING = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "scheduler_policy",
    "async_scheduling",
    "enable_prefix_caching",
    "max_model_len",
    "num_gpu_blocks",
)

# the server arguments that pin each setting (as servelab's config writes them)
PINNED_BY: dict[str, str] = {
    "max_num_seqs": "max-num-seqs",
    "max_num_batched_tokens": "max-num-batched-tokens",
    "enable_chunked_prefill": "enable-chunked-prefill",
    "scheduler_policy": "scheduling-policy",
    "async_scheduling": "async-scheduling",
    "max_model_len": "max-model-len",
    "dtype": "dtype",
    "quantization": "quantization",
    "enforce_eager": "enforce-eager",
    "block_size": "block-size",
    "kv_cache_dtype": "kv-cache-dtype",
    "enable_prefix_caching": "enable-prefix-caching",
    "gpu_memory_utilization": "gpu-memory-utilization",
    "num_gpu_blocks_override": "num-gpu-blocks-override",
    "num_gpu_blocks": "num-gpu-blocks-override",
    "tensor_parallel_size": "tensor-parallel-size",
    "pipeline_parallel_size": "pipeline-parallel-size",
}

_BACKEND = re.compile(r"Using (\S+?) (?:attention )?backend\b")
_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def from_log(log: str) -> tuple[JsonObject | None, str | None]:
    """The shim's report in a server log (its last one: a restarted server's), and the
    attention backend the log names; (None, ...) where the shim reported nothing."""
    report: JsonObject | None = None
    for line in log.splitlines():
        at = line.find(MARK)
        if at >= 0:
            try:
                doc: JsonValue = json.loads(line[at + len(MARK) :])
            except json.JSONDecodeError:
                continue
            report = doc if isinstance(doc, dict) else report
    backends = _BACKEND.findall(log)
    return report, (backends[-1] if backends else None)


def from_metrics(text: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` in a /metrics scrape (empty: none)."""
    m = _INFO.search(text)
    return dict(_LABEL.findall(m.group("labels"))) if m else {}


def effective(
    report: Mapping[str, JsonValue] | None, backend: str | None, cache_info: Mapping[str, str]
) -> dict[str, Setting] | None:
    """launch.json `engine.settings`: each setting's value and its source (engine, metrics,
    log); None where the shim reported nothing (a server that was not started through it)."""
    if report is None:
        return None
    out: dict[str, Setting] = {k: {"value": report.get(k), "source": "engine"} for k in FIELDS}
    blocks = cache_info.get("num_gpu_blocks")
    value = int(float(blocks)) if blocks not in (None, "", "None") else None
    out["num_gpu_blocks"] = {"value": value, "source": "metrics"}
    out["attention_backend"] = {"value": backend, "source": "log"}
    return dict(sorted(out.items()))


def asked(args: Mapping[str, object]) -> dict[str, object]:
    """What the server's arguments asked of each setting (only those they set)."""
    out: dict[str, object] = {}
    for name, flag in PINNED_BY.items():
        if flag in args:
            out[name] = args[flag]
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) if b is not None and a is not None else a == b
    try:
        if isinstance(a, str | int | float) and isinstance(b, str | int | float):
            return float(a) == float(b)
    except ValueError:
        pass
    return str(a).lower().removeprefix("torch.") == str(b).lower().removeprefix("torch.")


def departures(
    settings: Mapping[str, Mapping[str, object]], args: Mapping[str, object]
) -> list[str]:
    """The settings whose resolved value differs from what the arguments asked: 'max_num_seqs:
    asked 8, resolved 4'."""
    out = []
    for name, want in asked(args).items():
        got = (settings.get(name) or {}).get("value")
        if got is not None and want is not True and not _same(want, got):
            out.append(f"{name}: asked {want}, resolved {got}")
    return out


def record(log: str | None, scrape: str, args: Mapping[str, object]) -> EngineJson:
    """launch.json `engine` of a launch: the settings its server resolved, each with its
    source, from its log (None: a server servelab did not launch, which has none of
    servelab's) and a /metrics scrape, and those it resolved otherwise than `args` asked; for
    a server that reported none, why."""
    if log is None:
        return {"settings": None, "departures": [], "why": f"{NOT_RECORDED}: not launched"}
    report, backend = from_log(log)
    settings = effective(report, backend, from_metrics(scrape))
    if settings is None:
        why = f"{NOT_RECORDED}: the server's log has no {MARK.strip()} line"
        return {"settings": None, "departures": [], "why": why}
    return {"settings": settings, "departures": departures(settings, args)}
