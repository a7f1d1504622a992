"""The profiling pass on the sweep's own launch (profile.launch, docs/profile.md "Which
launch"): which configurations get it, the jobs the workflow plans for it, and the job itself
against tests/fake_vllm_server.py (vLLM's torch profiler endpoints as vLLM has them on the CPU):
one launch, started with the profiler configured, the capture after the sweep's last point."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from experiment_fixtures import measure_job, quiet
from workflow_env import snakemake_here

from servelab.config import validate
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.job import MeasureJob
from servelab.measure.sweep import run_sweep
from servelab.profile.plan import on_sweep_launch
from servelab.store.jsonio import read_json
from servelab.summary import on_sweep_captures, wall_line

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CAPTURE_SCHEMA = json.loads((REPO / "src/servelab/schemas/capture.schema.json").read_text())


def default_raw() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))


def experiment(raw: dict[str, Any]) -> Experiment:
    return Experiment.from_dict(validate(raw, "test").to_dict())


def test_which_configurations_are_profiled_on_the_sweeps_launch() -> None:
    raw = default_raw()
    # the default: the CPU torch profiler, a fixed number of repeats: every profiled config
    assert on_sweep_launch(experiment(raw)) == ["max-num-seqs-1", "max-num-seqs-8"]
    raw["profile"] = {"server_configs": ["max-num-seqs-8"]}
    assert on_sweep_launch(experiment(raw)) == ["max-num-seqs-8"]
    raw["profile"] = {"launch": "own"}
    assert on_sweep_launch(experiment(raw)) == []
    raw["profile"] = {"enabled": False}
    assert on_sweep_launch(experiment(raw)) == []  # not profiled: no capture, no profiler
    # a sequential plan's rounds end on launches of their own
    seq = default_raw()
    seq["sweep"]["repeats"] = {"min": 3, "max": 6}
    assert on_sweep_launch(experiment(seq)) == []
    seq["profile"] = {"launch": "sweep"}
    with pytest.raises(ServelabError, match="profile.launch: sweep does not go with a sequential"):
        on_sweep_launch(experiment(seq))
    # on a GPU: a launch of its own, nsys or not (auto); sweep is refused for nsys
    gpu = default_raw()
    gpu["runtime"].update(device="gpu", gpus=1)
    gpu["profile"] = {"tool": "torch"}
    assert on_sweep_launch(experiment(gpu)) == []
    gpu["profile"] = {"tool": "torch", "launch": "sweep"}
    assert on_sweep_launch(experiment(gpu)) == ["max-num-seqs-1", "max-num-seqs-8"]
    exp = experiment(gpu)
    from servelab.profile.plan import Decision

    with pytest.raises(ServelabError, match="'max-num-seqs-1' is profiled with nsys"):
        on_sweep_launch(exp, {"max-num-seqs-1": Decision("nsys")})


def dry_run(tmp_path: Path, profile: dict[str, Any]) -> str:
    raw = default_raw()
    raw["results_dir"] = str(tmp_path / "results")
    raw["profile"] = profile
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return snakemake_here(["-n", "--cores", "1", "--configfile", str(cfg), "--nolock"]).stdout


def test_the_workflow_plans_one_measuring_job_per_configuration(tmp_path: Path) -> None:
    """The default plans sweep_profile (run.json and capture.json, one job) for every
    configuration and no profile job; profile.launch own plans sweep, then profile."""
    out = dry_run(tmp_path, {})
    assert out.count("rule sweep_profile:") == 2, out[-3000:]
    assert "rule profile:" not in out and "rule sweep:" not in out
    assert "profile/max-num-seqs-1/capture.json" in out
    out = dry_run(tmp_path, {"launch": "own"})
    assert out.count("rule sweep:") == 2 and out.count("rule profile:") == 2
    assert "sweep_profile" not in out
    out = dry_run(tmp_path, {"server_configs": ["max-num-seqs-8"]})
    assert out.count("rule sweep_profile:") == 1 and out.count("rule sweep:") == 1


def fake_cpu(tmp_path: Path, say: Callable[[str], None] = quiet) -> MeasureJob:
    """The measuring job of a CPU experiment of one configuration, `fake`, served by
    tests/fake_vllm_server.py."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {TESTS / "fake_vllm_server.py"} "$@"\n')
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    vocab = {f"w{i}": i for i in range(1, 60)}
    (model / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    raw = default_raw()
    raw["results_dir"] = str(tmp_path / "results")
    raw["runtime"]["compile_cache"] = False
    raw["server"].update(
        startup_timeout_s=60, shutdown_timeout_s=10, args={}, configs=[{"name": "fake"}]
    )
    raw["workload"].update(input_tokens=4, output_tokens=8, waves=1)
    raw["workload"]["warmup"] = {"requests": 2, "concurrency": 2}
    raw["sweep"].update(concurrency=[1, 2], repeats=2)
    raw["profile"] = {"concurrency": [1, 2], "warmup_requests": 2, "vllm_interface": "config"}
    exp = experiment(raw)
    root = Path(exp.results_dir) / exp.experiment
    return measure_job(exp, root, model_dir=model, runtime={"python": str(python)}, say=say)


def test_the_profiling_pass_runs_on_the_sweeps_launch_after_its_last_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVELAB_LOCK_DIR", str(tmp_path / "locks"))
    said: list[str] = []
    job = fake_cpu(tmp_path, said.append)
    assert on_sweep_launch(job.exp) == ["fake"]
    root = job.paths.root
    run = run_sweep(job, "fake")
    assert run["status"] == "complete" and run["points"] == 4 and run["launches"] == 1
    launch = read_json(root / "server" / "fake" / "launch.json")
    cmd = launch["command"]
    profiler = json.loads(cmd[cmd.index("--profiler-config") + 1])  # configured from the start
    assert profiler["profiler"] == "torch"
    assert profiler["torch_profiler_dir"] == str((root / "profile/fake/torch-raw").resolve())
    capture = read_json(root / "profile" / "fake" / "capture.json")
    jsonschema.validate(capture, CAPTURE_SCHEMA)
    assert capture["status"] == "profiled" and capture["launch"] == "sweep"
    assert capture["tool"] == "torch" and capture["command"] == cmd
    assert capture["warmup"] == "the sweep's points"  # no warm-up of its own
    assert "ready_s" not in capture and "start" not in capture  # the start is launch.json's
    assert [p["label"] for p in capture["points"]] == ["c0001", "c0002"]
    assert capture["traces"] == ["torch/c0001.pt.trace.json.gz", "torch/c0002.pt.trace.json.gz"]
    for trace in capture["traces"]:
        assert (root / "profile" / "fake" / trace).stat().st_size > 0
    assert not (root / "profile" / "fake" / "server.log").exists()  # no server of its own
    assert not (root / "profile" / "fake" / "torch-raw").exists()
    assert not any("warm-up: 2 requests" in s and "profile" in s for s in said)
    # every profiled window starts after the sweep's last point ended
    last = max(
        read_json(p)["finished_epoch_ns"]
        for p in (root / "raw" / "fake").glob("rep*/c*/point.json")
    )
    windows = read_json(root / "profile" / "fake" / "windows.json")["windows"]
    assert len(windows) == 2 and min(w["start_ns"] for w in windows) > last
    # the summary counts the capture as profiling time, inside the sweep stage
    sweep_s = capture["job_wall_s"] + 5.0
    assert on_sweep_captures(root) == {"sweep-fake": capture["job_wall_s"]}
    line = wall_line(
        root,
        {"sweep-fake": sweep_s},
        [read_json(p) for p in sorted((root / "raw" / "fake").glob("rep*/c*/point.json"))],
    )
    assert line is not None and f"profiling pass {capture['job_wall_s']:.1f} s" in line

    # a rerun whose points are complete (capture.json lost): one launch, for the capture
    (root / "profile" / "fake" / "capture.json").unlink()
    said.clear()
    run = run_sweep(job, "fake")
    assert run["launches"] == 2
    assert any("all 4 points already complete; a launch for the profiling pass" in s for s in said)
    capture = read_json(root / "profile" / "fake" / "capture.json")
    assert capture["status"] == "profiled" and capture["warmup"] == "its own"
    assert read_json(root / "raw" / "fake" / "warmup" / "point.json")["launch"] == 1  # kept


def test_a_profiler_that_cannot_be_set_up_leaves_the_sweep_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """profile.vllm_interface auto asks the runtime's vLLM; a runtime without one cannot say:
    the sweep is measured on a plain launch and the capture is "not profiled", with why."""
    monkeypatch.setenv("SERVELAB_LOCK_DIR", str(tmp_path / "locks"))
    job = fake_cpu(tmp_path)
    raw = job.exp.to_dict()
    raw["profile"]["vllm_interface"] = "auto"
    job = replace(job, exp=Experiment.from_dict(raw))
    root = job.paths.root
    monkeypatch.setattr(
        "servelab.profile.capture.profiler_interface",
        lambda p, r: (_ for _ in ()).throw(ServelabError("the runtime's vLLM cannot be asked")),
    )
    run = run_sweep(job, "fake")
    assert run["status"] == "complete" and run["points"] == 4
    assert "--profiler-config" not in read_json(root / "server" / "fake" / "launch.json")["command"]
    capture = read_json(root / "profile" / "fake" / "capture.json")
    assert capture["status"] == "not profiled"
    assert capture["reason"] == "the runtime's vLLM cannot be asked"
    required = {**raw, "profile": {**raw["profile"], "required": True}}
    job = replace(job, exp=Experiment.from_dict(required))
    (root / "raw" / "fake" / "run.json").unlink()
    with pytest.raises(ServelabError, match="cannot be asked"):
        run_sweep(job, "fake")


def test_the_measurement_behind_auto_is_the_products_paired_test(tmp_path: Path) -> None:
    """benchmarks/bench_profile_launch.py pairs X-profiler with X repeat by repeat with
    servelab's paired test; a config that differs in every repeat is called different."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_profile_launch as bench
    finally:
        sys.path.pop(0)
    for sc, scale in (("a", 1.0), ("a-profiler", 1.0), ("b", 1.0), ("b-profiler", 0.8)):
        for rep, jitter in ((1, 1.0), (2, 1.02), (3, 0.99)):
            d = tmp_path / "raw" / sc / f"rep{rep:02d}" / "c0004"
            d.mkdir(parents=True)
            point = {
                "format_version": 1,
                "server_config": sc,
                "repeat": rep,
                "concurrency": 4,
                "status": "complete",
                "output_throughput": 100.0 * scale * jitter,
                "mean_ttft_ms": 50.0 * jitter,
                "mean_tpot_ms": 10.0 * jitter,
            }
            (d / "point.json").write_text(json.dumps(point))
    rows = {(r["server_config"], r["metric"]): r for r in bench.pairs_table(tmp_path, 5.0, 0.05)}
    assert rows[("a", "output_throughput")]["verdict"] == "not significant"
    assert rows[("a", "output_throughput")]["profiler_vs_plain_pct"] == 0.0
    assert rows[("b", "output_throughput")]["verdict"] == "a < b"
    assert rows[("b", "output_throughput")]["profiler_vs_plain_pct"] == pytest.approx(-20.0)
    assert rows[("b", "mean_ttft_ms")]["verdict"] == "not significant"
    pool = {(r["server_config"], r["metric"]): r for r in bench.pooled(tmp_path)}
    assert pool[("a", "output_throughput")]["ratio_pct"] == 0.0
    assert pool[("b", "output_throughput")]["ratio_pct"] == pytest.approx(-20.0)
    lo, hi = pool[("all", "output_throughput")]["ci95_pct"]
    assert lo < pool[("all", "output_throughput")]["ratio_pct"] < hi  # -20% in half the pairs
    assert os.path.basename(bench.__file__) == "bench_profile_launch.py"
