"""The engine settings a server resolved: the shim that reports them from inside the server's
Python (against a stand-in `vllm` package), their reading from a log and a /metrics scrape,
and what the arguments asked that the server did not do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servelab.env.engine_shim import FIELDS, shim_command
from servelab.launch import engine_config as ec

FAKE_VLLM = """
from types import SimpleNamespace
import enum

class Mode(enum.Enum):
    NONE = 0

class EngineArgs:
    def __init__(self, max_num_seqs=None):
        self.max_num_seqs = max_num_seqs

    def create_engine_config(self):
        return SimpleNamespace(
            scheduler_config=SimpleNamespace(
                max_num_seqs=self.max_num_seqs or 256,
                max_num_batched_tokens=2048,
                enable_chunked_prefill=True,
                policy="fcfs",
            ),
            model_config=SimpleNamespace(max_model_len=1024, dtype="torch.float32"),
            cache_config=SimpleNamespace(block_size=16, cache_dtype="auto"),
            compilation_config=SimpleNamespace(mode=Mode.NONE),
        )
"""

SERVER = """
import sys
from vllm.engine.arg_utils import EngineArgs
print("argv", sys.argv[0].endswith("fakeserver.py"), sys.argv[1:], flush=True)
EngineArgs(int(sys.argv[2])).create_engine_config()
"""


def test_the_shim_reports_what_the_engine_resolved_and_runs_the_module(tmp_path: Path) -> None:
    pkg = tmp_path / "vllm" / "engine"
    pkg.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "arg_utils.py").write_text(FAKE_VLLM)
    (tmp_path / "fakeserver.py").write_text(SERVER)
    cmd = [*shim_command(sys.executable, "fakeserver"), "--max-num-seqs", "12"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr
    # the module runs as __main__ with its own arguments, as `python -m` runs it
    assert "argv True ['--max-num-seqs', '12']" in out.stdout
    report, backend = ec.from_log(out.stderr + "\nINFO Using TORCH_SDPA backend.\n")
    assert report is not None and backend == "TORCH_SDPA"
    assert report["max_num_seqs"] == 12 and report["max_num_batched_tokens"] == 2048
    assert report["scheduler_policy"] == "fcfs" and report["compilation_mode"] == "NONE"
    # a section this vLLM lacks gives null, never a crash
    assert report["tensor_parallel_size"] is None and report["quantization"] is None


def test_a_shim_that_cannot_wrap_says_why_and_the_server_still_starts(tmp_path: Path) -> None:
    (tmp_path / "fakeserver.py").write_text("print('started')\n")
    out = subprocess.run(
        shim_command(sys.executable, "fakeserver"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0 and "started" in out.stdout
    assert "SERVELAB_ENGINE_CONFIG_ERROR" in out.stderr
    assert ec.from_log(out.stderr) == (None, None)


def test_settings_carry_their_source_and_the_kv_blocks_come_from_metrics() -> None:
    report = {k: None for k in FIELDS} | {"max_num_seqs": 8, "max_num_batched_tokens": 2048}
    scrape = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="68"} 1.0\n'
    )
    settings = ec.effective(report, None, ec.from_metrics(scrape))
    assert settings is not None
    assert settings["max_num_seqs"] == {"value": 8, "source": "engine"}
    assert settings["num_gpu_blocks"] == {"value": 68, "source": "metrics"}
    assert settings["attention_backend"] == {"value": None, "source": "log"}
    assert ec.effective(None, "X", {}) is None  # no report: not recorded


def test_a_setting_resolved_otherwise_than_asked_is_named() -> None:
    settings = {
        "max_num_seqs": {"value": 4, "source": "engine"},
        "dtype": {"value": "torch.float32", "source": "engine"},
        "enable_prefix_caching": {"value": False, "source": "engine"},
    }
    args = {"max-num-seqs": 8, "dtype": "float32", "enable-prefix-caching": True}
    assert ec.departures(settings, args) == ["max_num_seqs: asked 8, resolved 4"]


def write_launch(root: Path, sc: str, settings: dict[str, object] | None, **args: object) -> None:
    """server/<sc>/launch.json with the engine `settings` its server resolved ({name: value},
    from the engine; None: none recorded) and its server arguments."""
    from servelab.store.jsonio import write_json

    doc: dict[str, object] = {"launch": 1, "server_config": sc, "args": args}
    if settings is not None:
        values = {k: {"value": v, "source": "engine"} for k, v in settings.items()}
        doc["engine"] = {"settings": values, "departures": ec.departures(values, args)}
    write_json(root / "server" / sc / "launch.json", doc)


def test_two_configurations_of_one_run_name_what_their_servers_resolved_apart(
    tmp_path: Path,
) -> None:
    """An A/B of two vLLM releases with the same arguments: the default one changed is named,
    with both values; the summary shows each server as it ran and what it did not do of what
    it was asked; a configuration without a record says so."""
    from servelab.analysis.engine_diff import engine_text, launches_of, pair_engine, resolved_lines

    old = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "block_size": 128}
    write_launch(tmp_path, "vllm-0.31", old, **{"max-num-seqs": 256})
    write_launch(tmp_path, "vllm-0.32", {**old, "max_num_batched_tokens": 4096, "max_num_seqs": 8},
                 **{"max-num-seqs": 256})  # fmt: skip
    lines = pair_engine(launches_of(tmp_path), "vllm-0.31", "vllm-0.32")
    assert lines == [
        "max_num_batched_tokens 2048 -> 4096 (vLLM's own choice on each side: not pinned)",
        "max_num_seqs 256 -> 8 (both asked 256; vLLM resolved otherwise)",
    ]
    assert engine_text(lines)[1] == "Engine settings that differ, as the two servers resolved them:"
    assert engine_text([])[1].endswith("none differs.") and engine_text(None) == []
    summary = resolved_lines(tmp_path)
    assert "  vllm-0.32: max_num_seqs 8, max_num_batched_tokens 4096, block_size 128" in summary
    assert "  vllm-0.32: resolved otherwise than asked: max_num_seqs: asked 256, resolved 8" in (
        summary
    )
    write_launch(tmp_path, "old", None)
    assert "  old: effective configuration not recorded" in resolved_lines(tmp_path)
    assert pair_engine(launches_of(tmp_path), "old", "vllm-0.32") == [
        "old / vllm-0.32: effective configuration not recorded in old"
    ]
