"""The shim a vLLM server is started through, so that it reports the engine settings it
resolved (servelab.launch.engine_config reads the report): `python -c SHIM MODULE ARGS...` in
place of `python -m MODULE ARGS...`. It wraps vLLM's `EngineArgs.create_engine_config` and
prints the resolved scheduler, cache, model, compilation and parallel settings as one line,
`SERVELAB_ENGINE_CONFIG {json}`, on the server's stderr (its log), for a venv, a container or a
cluster job alike; it needs no file of servelab's inside the runtime. A vLLM it cannot wrap
prints `SERVELAB_ENGINE_CONFIG_ERROR ...` and starts as before.
"""

from __future__ import annotations

import json

MARK = "SERVELAB_ENGINE_CONFIG "
FAILED = "SERVELAB_ENGINE_CONFIG_ERROR "
# name -> (the VllmConfig section, its attribute): what the shim reads, in order
FIELDS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "scheduler_policy": ("scheduler_config", "policy"),
    "async_scheduling": ("scheduler_config", "async_scheduling"),
    "max_model_len": ("model_config", "max_model_len"),
    "dtype": ("model_config", "dtype"),
    "quantization": ("model_config", "quantization"),
    "enforce_eager": ("model_config", "enforce_eager"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
    "num_gpu_blocks_override": ("cache_config", "num_gpu_blocks_override"),
    "compilation_mode": ("compilation_config", "mode"),
    "cudagraph_mode": ("compilation_config", "cudagraph_mode"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "pipeline_parallel_size": ("parallel_config", "pipeline_parallel_size"),
    "device": ("device_config", "device_type"),
}

# Runs in the server's own Python (`python -c SHIM MODULE ARGS...`): no import of servelab's.
SHIM = (
    "import enum, json, runpy, sys\n"
    "FIELDS = " + json.dumps(FIELDS) + "\n"
    "def _plain(v):\n"
    "    if isinstance(v, enum.Enum):\n"
    "        return v.name\n"
    "    if v is None or isinstance(v, (bool, int, float, str)):\n"
    "        return v\n"
    "    return str(v)\n"
    "def _failed(exc):\n"
    "    print(" + repr(FAILED) + " + repr(exc), file=sys.stderr, flush=True)\n"
    "def _report(cfg):\n"
    "    out = {}\n"
    "    for key, (part, attr) in FIELDS.items():\n"
    "        section = getattr(cfg, part, None)\n"
    "        out[key] = _plain(getattr(section, attr, None)) if section is not None else None\n"
    "    print(" + repr(MARK) + " + json.dumps(out, sort_keys=True), file=sys.stderr, flush=True)\n"
    "try:\n"
    "    from vllm.engine.arg_utils import EngineArgs\n"
    "    _create = EngineArgs.create_engine_config\n"
    "    def _create_and_report(self, *a, **k):\n"
    "        cfg = _create(self, *a, **k)\n"
    "        try:\n"
    "            _report(cfg)\n"
    "        except Exception as exc:\n"
    "            _failed(exc)\n"
    "        return cfg\n"
    "    EngineArgs.create_engine_config = _create_and_report\n"
    "except Exception as exc:\n"
    "    _failed(exc)\n"
    "module = sys.argv[1]\n"
    "sys.argv = [module] + sys.argv[2:]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def shim_command(python: str, module: str) -> list[str]:
    """The server's start through the shim: `python -c SHIM MODULE` (then the module's own
    arguments), in place of `python -m MODULE`."""
    return [python, "-c", SHIM, module]
