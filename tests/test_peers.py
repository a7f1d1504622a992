"""Other tools' results read as points (servelab.analysis.peers): real AIPerf 0.13 and GuideLLM
0.8 runs (tests/fixtures/tools/, three repeats of c=4 each, made against the CPU default's
server) laid out as a vllm-bench tree, loaded with servelab's definitions and compared; another
version or layout refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servelab.analysis.dataset import load_dataset
from servelab.analysis.peers import read_aiperf, read_guidellm
from servelab.errors import ServelabError

TOOLS = Path(__file__).resolve().parent / "fixtures" / "tools"


def tree(tmp_path: Path, tool: str, files: tuple[str, ...]) -> Path:
    """rep_0N/concurrency_004/ holding repN's result files of `tool`."""
    root = tmp_path / tool
    for n in (1, 2, 3):
        point = root / f"rep_{n:02d}" / "concurrency_004"
        point.mkdir(parents=True)
        for name in files:
            shutil.copy(TOOLS / tool / f"rep{n:02d}" / name, point / name)
    return root


def aiperf_tree(tmp_path: Path) -> Path:
    return tree(tmp_path, "aiperf", ("profile_export.jsonl", "profile_export_aiperf.json"))


def guidellm_tree(tmp_path: Path) -> Path:
    return tree(tmp_path, "guidellm", ("benchmarks.json",))


def test_an_aiperf_run_reads_as_its_own_summary_says(tmp_path: Path) -> None:
    ds = load_dataset(aiperf_tree(tmp_path))
    assert [(p.repeat, p.level.value) for p in ds.points] == [(1, 4), (2, 4), (3, 4)]
    for p in ds.points:
        summary = json.loads(
            (TOOLS / "aiperf" / f"rep{p.repeat:02d}" / "profile_export_aiperf.json").read_text()
        )
        # 16 sent, 1 failed (its tokens decode to no text), as AIPerf counts them
        assert p.metrics["num_prompts"] == 16 and p.metrics["completed"] == 15
        # mean TTFT over the same 15 requests: AIPerf's own mean, to the float
        assert p.metrics["mean_ttft_ms"] == pytest.approx(summary["time_to_first_token"]["avg"])
        # output tokens as the server counted them (64 each), not AIPerf's re-tokenized count
        assert p.metrics["total_output_tokens"] == 15 * 64
        assert p.metrics["duration"] == pytest.approx(summary["benchmark_duration"]["avg"])
    bench = read_aiperf(TOOLS / "aiperf" / "rep01" / "profile_export.jsonl")
    starts = bench["start_times"]
    assert starts[0] == 0.0 and starts == sorted(starts)  # in send order
    assert sum(1 for e in bench["errors"] if e) == 1


def test_a_guidellm_run_reads_as_its_own_summary_says(tmp_path: Path) -> None:
    ds = load_dataset(guidellm_tree(tmp_path))
    assert len(ds.points) == 3
    for p in ds.points:
        data = json.loads(
            (TOOLS / "guidellm" / f"rep{p.repeat:02d}" / "benchmarks.json").read_text()
        )
        metrics = data["benchmarks"][0]["metrics"]
        assert p.metrics["completed"] == metrics["time_to_first_token_ms"]["successful"]["count"]
        assert p.metrics["mean_ttft_ms"] == pytest.approx(
            metrics["time_to_first_token_ms"]["successful"]["mean"]
        )
        assert p.metrics["total_output_tokens"] == 16 * 64
    bench = read_guidellm(TOOLS / "guidellm" / "rep01" / "benchmarks.json")
    assert bench["max_concurrency"] == 4
    # a request's gaps are its mean ITL, one per token after the first
    assert all(len(g or []) == 63 for g in bench["itls"])


def test_an_inference_perf_stage_reads_into_a_single_side_analysis(tmp_path: Path) -> None:
    from servelab.analysis.peers import tool_version

    point = tmp_path / "inference-perf" / "rep_01" / "concurrency_004"
    shutil.copytree(TOOLS / "inference-perf" / "run01", point)
    ds = load_dataset(tmp_path / "inference-perf")
    summary = json.loads((point / "summary_lifecycle_metrics.json").read_text())
    (p,) = ds.points
    assert p.metrics["completed"] == summary["successes"]["count"] == 16
    ttft = summary["successes"]["latency"]["time_to_first_token"]["mean"]
    assert p.metrics["mean_ttft_ms"] == pytest.approx(1000 * ttft)
    # the server's usage (64 each), not inference-perf's own re-tokenized count (30-212)
    assert p.metrics["total_output_tokens"] == 16 * 64
    assert p.metrics["duration"] == pytest.approx(summary["benchmark_time_seconds"])
    records = point / "per_request_lifecycle_metrics.json"
    assert tool_version(records, "inference-perf") == "inference-perf (report format 0.2.1)"
    report = point / "inference-perf.partial.stage_0.yaml"
    report.write_text(report.read_text().replace("version: 0.2.1", "version: 0.3.0", 1))
    with pytest.raises(ServelabError, match="written by inference-perf report format 0.3.0"):
        load_dataset(tmp_path / "inference-perf")
    report.unlink()
    with pytest.raises(ServelabError, match="no inference-perf.partial.stage_0.yaml beside it"):
        load_dataset(tmp_path / "inference-perf")


def test_another_version_or_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    root = aiperf_tree(tmp_path)
    summary = root / "rep_01" / "concurrency_004" / "profile_export_aiperf.json"
    summary.write_text(
        summary.read_text().replace('"aiperf_version": "0.13.0"', '"aiperf_version": "0.12.1"')
    )
    with pytest.raises(ServelabError) as err:
        load_dataset(root)
    said = str(err.value)
    assert str(summary) in said and "written by aiperf 0.12.1" in said
    assert "servelab reads aiperf 0.13.x results" in said and "\n" not in said
    (root / "rep_02" / "concurrency_004" / "profile_export_aiperf.json").unlink()
    summary.write_text(summary.read_text().replace("0.12.1", "0.13.0"))
    with pytest.raises(ServelabError, match="no profile_export_aiperf.json beside it"):
        load_dataset(root)
    g = guidellm_tree(tmp_path)
    path = g / "rep_01" / "concurrency_004" / "benchmarks.json"
    data = json.loads(path.read_text())
    data["benchmarks"] = data["benchmarks"] * 2  # a sweep in one file
    path.write_text(json.dumps(data))
    with pytest.raises(ServelabError, match="2 benchmarks; a point folder holds one"):
        load_dataset(g)
    data["benchmarks"] = data["benchmarks"][:1]
    data["metadata"]["guidellm_version"] = "0.9.0"
    path.write_text(json.dumps(data))
    with pytest.raises(ServelabError, match="written by guidellm 0.9.0"):
        load_dataset(g)


def test_compare_reads_them_and_refuses_to_compare_two_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servelab.cli import main

    guidellm = guidellm_tree(tmp_path)
    again = tmp_path / "again" / "guidellm"
    shutil.copytree(guidellm, again)
    out = tmp_path / "out"
    # the same GuideLLM run against itself: the points pair up, and a claim on them reproduces
    claim = "throughput[config=guidellm,c=4] > 100"
    rc = main(["compare", str(guidellm), str(again), "--out", str(out), "--claim", claim])
    said = capsys.readouterr().out
    record = json.loads((out / "reproduction.json").read_text())
    assert rc == 0 and record["verdict"] == "REPRODUCED", said
    # two clients measure differently: their runs are not one setup measured twice
    rc = main(["compare", str(aiperf_tree(tmp_path)), str(guidellm), "--out", str(out)])
    said = capsys.readouterr().out
    record = json.loads((out / "reproduction.json").read_text())
    assert rc == 3 and record["verdict"] == "NOT COMPARABLE", said
    assert "benchmark.tool" in record["why"]


def test_aiperfs_failed_request_invalidates_its_points(tmp_path: Path) -> None:
    # AIPerf rejected one response per run (its 64 tokens decode to no text): servelab counts
    # the failure against the point, as it would its own client's
    ds = load_dataset(aiperf_tree(tmp_path))
    for p in ds.points:
        failed = [f for f in p.checks if f.check == "failed_requests"]
        assert failed and failed[0].status == "failed", p.checks


V9 = Path(__file__).resolve().parents[1] / "evidence" / "quickstart-cpu" / "v9"


def test_crosscheck_sets_the_tools_beside_servelabs_run_and_names_the_causes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servelab.analysis.dataset import load_dataset as load
    from servelab.analysis.stats import ratio_ci
    from servelab.cli import main

    ip = tmp_path / "inference-perf" / "rep_01" / "concurrency_004"
    shutil.copytree(TOOLS / "inference-perf" / "run01", ip)
    trees = [guidellm_tree(tmp_path), tmp_path / "inference-perf"]
    out = tmp_path / "out"
    # release v9: the same server (tiny model, max-num-seqs 8) at the same point (c=4, 128 -> 64)
    args = ["crosscheck", str(V9), *map(str, trees), "--config", "max-num-seqs-8"]
    assert main([*args, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert said == (out / "clients.md").read_text()
    from servelab.reproduce.sides import open_side

    side = open_side(V9, tmp_path / "v9", "run")
    ours = [
        float(p.metrics["output_throughput"] or 0)
        for p in load(side.root, validity=side.analysis.validity).points
        if p.server_config == "max-num-seqs-8" and p.level.value == 4
        if not p.left_out("output_throughput")
    ]
    theirs = [float(p.metrics["output_throughput"] or 0) for p in load(trees[0]).points]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in said.splitlines()]
    row = next(r for r in rows if r[0].startswith("guidellm 0.8.1") and r[2] == "output_throughput")
    assert row[1] == "c=4"
    assert row[3] == f"{sum(ours) / len(ours):.4g} (n = {len(ours)})"
    assert row[4] == f"{sum(theirs) / 3:.4g} (n = 3)"
    # the tool's geometric mean over servelab's, with its Welch interval
    r = ratio_ci(theirs, ours)
    assert r is not None and r.low is not None and r.high is not None
    assert row[5] == f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}]"
    # GuideLLM's TTFT is invalid: 5-6 of its 16 streams arrived in one read on 2 shared cores
    ttft = next(
        line for line in said.splitlines() if "guidellm 0.8.1" in line and "mean_ttft_ms" in line
    )
    assert "| invalid |" in ttft
    assert "guidellm 0.8.1 (guidellm): streams that arrived in one read" in said
    # inference-perf re-tokenizes the text: its count beside the server's
    assert "counts output tokens by re-tokenizing the text: 1617 against the server's 1024" in said


def test_crosscheck_refuses_what_it_cannot_pair(tmp_path: Path) -> None:
    import argparse

    from servelab.cli import main
    from servelab.cli.crosscheck import run as crosscheck

    tree_ = guidellm_tree(tmp_path)
    with pytest.raises(ServelabError, match="server configurations max-num-seqs-1, max-num-seqs-8"):
        crosscheck(argparse.Namespace(run=str(V9), trees=[str(tree_)], config=None, out=None))
    assert main(["crosscheck", str(V9), str(tree_), "--config", "nope"]) == 2
    assert main(["crosscheck", str(V9), str(tmp_path), "--config", "max-num-seqs-8"]) == 2
    assert main(["crosscheck", str(tree_), str(tree_)]) == 2  # not servelab's run


def test_a_vllm_bench_tree_of_aggregates_only_is_read_and_the_verdict_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm bench saved without --save-detailed: the point is read from its aggregates, every
    check not run (saying why), and a comparison with it says its side is aggregates only."""
    from analysis_fixtures import vllm_bench_tree

    from servelab.cli import main

    detailed = vllm_bench_tree(tmp_path / "detailed", {4: [(400.0, 100.0), (410.0, 98.0)]})
    summary = tmp_path / "summary"
    shutil.copytree(detailed, summary)
    for f in summary.rglob("benchmark.json"):
        doc = json.loads(f.read_text())
        for key in ("ttfts", "itls", "output_lens", "input_lens", "latencies", "start_times"):
            doc.pop(key, None)
        doc |= {"total_input_tokens": 80, "total_output_tokens": 400}
        doc |= {"mean_ttft_ms": 100.0, "median_ttft_ms": 99.0, "p99_ttft_ms": 130.0}
        f.write_text(json.dumps(doc))
    ds = load_dataset(summary)
    p = ds.points[0]
    assert p.extra["aggregates_only"] is True
    assert p.metrics["mean_ttft_ms"] == 100.0 and p.metrics["median_ttft_ms"] == 99.0
    assert p.metrics["p99_ttft_ms"] is None  # 8 requests cannot support a p99
    assert p.metrics["output_throughput"] == pytest.approx(400 / p.metrics["duration"])
    assert {f.status for f in p.checks} == {"not checked"}
    assert "aggregates only" in p.checks[0].reason
    # the detailed run against its own aggregates: a verdict, saying which side had only those
    out = tmp_path / "out"
    claim = "throughput[config=detailed,c=4] > 100"
    rc = main(["compare", str(detailed), str(summary), "--out", str(out), "--claim", claim])
    said = capsys.readouterr().out
    record = json.loads((out / "reproduction.json").read_text())
    assert rc in (0, 1, 3) and record["verdict"], said
    assert any(
        "fresh run's results are aggregates only in 2 of its 2" in n for n in record["notes"]
    )
    assert "aggregates only" in (out / "report.md").read_text()
    # neither lists nor aggregates: refused in one line
    for f in summary.rglob("benchmark.json"):
        doc = json.loads(f.read_text())
        doc.pop("mean_ttft_ms")
        f.write_text(json.dumps(doc))
    with pytest.raises(ServelabError, match="key 'ttfts' missing; save with --save-result"):
        load_dataset(summary)


def test_a_guidellm_request_without_a_first_token_is_counted_but_not_timed(tmp_path: Path) -> None:
    # GuideLLM 0.8.1 records a successful request whose output carried no text with
    # time_to_first_token_ms null (4 of 372 in the CPU examples' runs): not a TTFT of 0
    data = json.loads((TOOLS / "guidellm" / "rep01" / "benchmarks.json").read_text())
    requests = data["benchmarks"][0]["requests"]["successful"]
    timed = [float(r["time_to_first_token_ms"]) for r in requests[1:]]
    requests[0]["time_to_first_token_ms"] = None
    path = tmp_path / "rep_01" / "concurrency_004" / "benchmarks.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    bench = read_guidellm(path)
    assert None in bench["ttfts"] and bench["ttfts"].count(None) == 1
    (point,) = load_dataset(tmp_path).points
    assert point.metrics["completed"] == 16 and point.metrics["total_output_tokens"] == 16 * 64
    assert point.metrics["mean_ttft_ms"] == pytest.approx(sum(timed) / len(timed))
    assert len(point.ttfts_ms) == 15
