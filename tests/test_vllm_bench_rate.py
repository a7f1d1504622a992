"""`vllm bench serve --request-rate R` result trees (rep_<NN>/rate_<R>/benchmark.json): read as
open-loop points (the rate, the arrival process as far as vLLM records it, the open-loop checks
from its send times), analysed and compared by rate, and read by servelab.dataframes; the
errors (an infinite rate, a tree mixing concurrency and rate folders, a ramp-up run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import vllm_bench_rate_point, vllm_bench_rate_tree, vllm_bench_tree

from servelab import dataframes
from servelab.analysis.dataset import detect_layout, load_dataset
from servelab.analysis.pipeline import analysis_section, analyze
from servelab.analysis.validity import CHECKS, OPEN_LOOP_CHECKS
from servelab.cli import main
from servelab.errors import ServelabError
from servelab.store.jsonio import read_json

# (TTFT ms, E2EL ms) per repeat: latency grows with the offered rate
SPEC = {
    1.0: [(50.0, 200.0), (52.0, 205.0), (49.0, 198.0)],
    2.0: [(60.0, 250.0), (61.0, 255.0), (59.0, 248.0)],
    4.0: [(120.0, 500.0), (125.0, 510.0), (118.0, 495.0)],
}
N, OUT = 40, 8  # requests per point, output tokens per request


def flags(root: Path, rate: float | None = None) -> dict[str, Any]:
    """The checks of the first point (at `rate` when given), by name."""
    points = [p for p in load_dataset(root).points if rate is None or p.level.rate == rate]
    return {f.check: f for f in points[0].checks}


def write(root: Path, folder: str, bench: dict[str, Any]) -> Path:
    d = root / "rep_01" / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "benchmark.json").write_text(json.dumps(bench))
    return root


# --- reading ---------------------------------------------------------------------------------


def test_a_rate_tree_reads_as_open_loop_points(tmp_path: Path) -> None:
    root = vllm_bench_rate_tree(tmp_path / "qwen", SPEC)
    assert detect_layout(root) == "vllm-bench"
    ds = load_dataset(root)
    assert sorted({p.level.rate for p in ds.points}) == [1.0, 2.0, 4.0]
    assert all(p.level.axis == "rate" and p.level.concurrency is None for p in ds.points)
    p = next(p for p in ds.points if p.level.rate == 1.0 and p.repeat == 1)
    assert p.label == "rep01 rate=1 qwen"
    assert p.extra["arrival"] == {
        "process": "poisson",
        "burstiness": 1.0,
        "max_in_flight": None,
        "requests": N,
        # vllm bench records no schedule: nothing is read of one
        "repeated_gaps": None,
        "scheduled_early": None,
        "scheduled_rate": None,
    }
    assert p.extra["offered_rate"] == 1.0  # the target, to which vllm bench scales its schedule
    # request i released at (i + 1) / R, the last ends E2EL later: duration 40 / 1 + 0.2 s
    assert p.metrics["duration"] == pytest.approx(40.2)
    assert p.metrics["output_throughput"] == pytest.approx(N * OUT / 40.2)
    assert p.metrics["mean_ttft_ms"] == pytest.approx(50.0)
    assert p.metrics["mean_e2el_ms"] == pytest.approx(200.0)
    f = flags(root, 1.0)
    assert [c.name for c in OPEN_LOOP_CHECKS] == list(f)[-3:]
    assert "achieved_concurrency" not in f and "client_wait" not in f
    assert f["arrival_rate"].status == "passed" and f["arrival_rate"].value == pytest.approx(0.0)
    assert f["send_slip"].status == "not checked"
    assert f["send_slip"].reason == "the scheduled send times are not recorded by vllm bench"
    assert f["cap_reached"].status == "not checked"
    assert f["cap_reached"].reason == "no cap on requests in flight"
    assert all(p.valid for p in ds.points)


def test_the_rate_is_the_benchmark_json_s_own_else_the_folder_s(tmp_path: Path) -> None:
    bench = vllm_bench_rate_point(2.5, 50.0, 200.0)
    ds = load_dataset(write(tmp_path / "a", "rate_2", bench))
    assert [p.level.rate for p in ds.points] == [2.5]
    del bench["request_rate"]
    ds = load_dataset(write(tmp_path / "b", "rate_0.5", bench))
    assert [p.level.rate for p in ds.points] == [0.5] and isinstance(ds.points[0].level.rate, float)


@pytest.mark.parametrize(
    ("burstiness", "process", "recorded"),
    [
        (1.0, "poisson", 1.0),
        (0.5, "gamma", 0.5),
        (float("inf"), "constant", 1.0),
        (None, "poisson", 1.0),
    ],
)
def test_the_arrival_process_is_vllm_s_burstiness(
    tmp_path: Path, burstiness: float | None, process: str, recorded: float
) -> None:
    """vLLM draws gamma gaps of shape B (1: poisson); B = inf gives constant gaps; a file without
    the key was written with the default, 1."""
    bench = vllm_bench_rate_point(2.0, 50.0, 200.0)
    if burstiness is None:
        del bench["burstiness"]
    else:
        bench["burstiness"] = burstiness  # json writes inf as Infinity, as vLLM's json does
    arrival = load_dataset(write(tmp_path, "rate_2", bench)).points[0].extra["arrival"]
    assert (arrival["process"], arrival["burstiness"]) == (process, recorded)


# --- the open-loop checks from what vLLM records ---------------------------------------------


def test_a_cap_that_holds_requests_back_is_noted_and_slows_the_sends(tmp_path: Path) -> None:
    """--max-concurrency 1 and 153 ms a request at 10 req/s: from the second on, every request
    is released while the one before is in flight and waits (queue_times); the sends then come
    every 153 ms, 6.54 req/s, not 10: the point offered a lighter load than asked."""
    root = vllm_bench_rate_tree(tmp_path / "capped", {10.0: [(50.0, 153.0)]}, cap=1)
    f = flags(root)
    assert f["cap_reached"].status == "noted" and f["cap_reached"].value == pytest.approx(39 / 40)
    assert "39 of 40 requests were released while all 1 slots" in f["cap_reached"].reason
    rate = f["arrival_rate"]
    assert rate.status == "failed"
    assert rate.value == pytest.approx(100 * (1 - 1000 / 153 / 10), rel=1e-6)
    assert load_dataset(root).points[0].extra["arrival"]["max_in_flight"] == 1
    # requests that end before the next is due never wait for the slot
    quick = vllm_bench_rate_tree(tmp_path / "quick", {10.0: [(20.0, 50.0)]}, cap=1)
    f = flags(quick)
    assert f["cap_reached"].status == "passed" and f["arrival_rate"].status == "passed"


def test_a_client_that_falls_behind_fails_the_arrival_rate(tmp_path: Path) -> None:
    """Each send 20 ms later than the one before at 4 req/s: sent every 270 ms, 3.70 req/s,
    7.4% short of the target (limit 5%); 5 ms later each: 1.96% short, within it."""
    late = vllm_bench_rate_tree(tmp_path / "late", {4.0: [(50.0, 200.0)]}, lag_ms=20.0)
    f = flags(late)["arrival_rate"]
    assert f.status == "failed" and f.value == pytest.approx(100 * (1 - 1 / 0.27 / 4), rel=1e-6)
    assert "requests sent at 3.7 req/s, target 4 req/s" in f.reason
    assert not load_dataset(late).points[0].valid
    slight = vllm_bench_rate_tree(tmp_path / "slight", {4.0: [(50.0, 200.0)]}, lag_ms=5.0)
    assert flags(slight)["arrival_rate"].status == "passed"


def test_checks_on_what_older_vllm_versions_did_not_record(tmp_path: Path) -> None:
    """Without start_times (vLLM before 2026-01) nothing says when requests were sent; without
    queue_times (before 2026-08) nothing says which waited for a slot."""
    bench = vllm_bench_rate_point(2.0, 50.0, 200.0, cap=4)
    del bench["queue_times"]
    f = flags(write(tmp_path / "a", "rate_2", bench))
    assert f["arrival_rate"].status == "passed"
    assert f["cap_reached"].status == "not checked"
    assert "queue_times" in f["cap_reached"].reason
    assert "not recorded by vllm bench" in f["cap_reached"].reason
    del bench["start_times"]
    f = flags(write(tmp_path / "b", "rate_2", bench))
    assert f["arrival_rate"].status == "not checked"
    assert f["arrival_rate"].reason == "the send times (start_times) are not recorded by vllm bench"


# --- analyse, compare, dataframes --------------------------------------------------------------


def test_a_rate_tree_is_analysed_by_rate(tmp_path: Path) -> None:
    root = vllm_bench_rate_tree(tmp_path / "qwen", SPEC)
    claims = [
        "mean_ttft_ms[rate=4] > 2 * mean_ttft_ms[rate=1]",
        "throughput[rate=2] > 1.5 * throughput[rate=1]",
        "mean_ttft_ms[rate=4] < 50",
    ]
    out = tmp_path / "out"
    res = analyze(root, out, analysis_section({"claims": claims}), figures=False)
    assert [c["verdict"] for c in res.claims] == ["holds", "holds", "fails"]
    header = (out / "points.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["server_config", "repeat", "rate"] and "concurrency" not in header
    first = (out / "points.csv").read_text().splitlines()[1].split(",")
    assert first[:3] == ["qwen", "1", "1"]
    assert float(first[header.index("output_throughput")]) == pytest.approx(N * OUT / 40.2)
    assert (out / "summary.csv").read_text().startswith("server_config,rate,")
    validity = read_json(out / "validity.json")
    assert [c["name"] for c in validity["checks"]][-3:] == [c.name for c in OPEN_LOOP_CHECKS]
    assert validity["points"][0]["rate"] == 1.0
    report = (out / "report.md").read_text()
    assert "## Throughput by request rate" in report
    # the CLI: the same tables
    assert main(["analyze", str(root), "--out", str(tmp_path / "cli"), "--no-figures"]) == 0
    cli_points = (tmp_path / "cli" / "points.csv").read_bytes()
    assert cli_points == (out / "points.csv").read_bytes()


def test_compare_rate_trees(tmp_path: Path, capsys: Any) -> None:
    ref = vllm_bench_rate_tree(tmp_path / "published", SPEC)
    slower = {r: [(t * 1.01, e * 1.01) for t, e in reps] for r, reps in SPEC.items()}
    good = vllm_bench_rate_tree(tmp_path / "rerun", slower)
    # TTFT at 4 req/s under that at 1 req/s: the claim below no longer holds
    moved = vllm_bench_rate_tree(tmp_path / "moved", {**SPEC, 4.0: [(40.0, 500.0)] * 3})
    claim = "mean_ttft_ms[rate=4] > 2 * mean_ttft_ms[rate=1]"
    args = [str(ref), str(good), "--claim", claim, "--out", str(tmp_path / "o")]
    assert main(["compare", *args]) == 0
    assert capsys.readouterr().out.startswith("reproduction: REPRODUCED")
    r = read_json(tmp_path / "o" / "reproduction.json")
    assert r["reference"]["kind"] == "vllm-bench" and r["claims"][0]["claim"] == claim
    fields = {f["field"]: f for f in r["provenance"]["fields"]}
    assert fields["benchmark.burstiness"]["same"] is True
    assert main(["compare", str(ref), str(moved), "--claim", claim]) == 1
    assert "NOT REPRODUCED" in capsys.readouterr().out
    # another arrival process is another experiment
    for f in good.glob("rep_*/rate_*/benchmark.json"):
        f.write_text(json.dumps({**json.loads(f.read_text()), "burstiness": 0.5}))
    assert main(["compare", str(ref), str(good), "--out", str(tmp_path / "b")]) == 3
    r = read_json(tmp_path / "b" / "reproduction.json")
    assert r["provenance"]["blocking"] == ["benchmark.burstiness"]


def test_dataframes_of_a_rate_tree(tmp_path: Path) -> None:
    root = vllm_bench_rate_tree(tmp_path / "qwen", SPEC)
    pts = dataframes.points(root)
    assert list(pts.columns[:3]) == ["server_config", "repeat", "rate"]
    assert "concurrency" not in pts.columns and len(pts) == 9
    assert list(pts["rate"]) == [1.0] * 3 + [2.0] * 3 + [4.0] * 3
    reqs = dataframes.requests(root)
    assert list(reqs.columns[:4]) == ["server_config", "repeat", "rate", "request"]
    assert "concurrency" not in reqs.columns and len(reqs) == 9 * N
    assert {"start_times", "queue_times"} <= set(reqs.columns)
    assert list(reqs["rate"].unique()) == [1.0, 2.0, 4.0]
    assert reqs["ttft_ms"].iloc[0] == pytest.approx(50.0)


# --- errors, and concurrency trees as before ---------------------------------------------------


def _one_line_error(root: Path, needle: str) -> None:
    for read in (load_dataset, dataframes.requests):
        with pytest.raises(ServelabError) as err:
            read(root)
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_an_infinite_rate_is_not_a_rate_point(tmp_path: Path) -> None:
    bench = vllm_bench_rate_point(2.0, 50.0, 200.0)
    bench["request_rate"] = "inf"  # what vLLM writes for its default
    _one_line_error(write(tmp_path / "a", "rate_2", bench), "request rate inf")
    del bench["request_rate"]
    _one_line_error(write(tmp_path / "b", "rate_inf", bench), "is not a rate point")


def test_a_ramp_up_run_has_no_single_rate(tmp_path: Path) -> None:
    bench = vllm_bench_rate_point(2.0, 50.0, 200.0)
    bench.update(request_rate="inf", ramp_up_strategy="linear")
    _one_line_error(write(tmp_path, "rate_2", bench), "a ramp-up run")


def test_a_tree_of_concurrencies_and_rates_is_an_error(tmp_path: Path) -> None:
    root = vllm_bench_tree(tmp_path / "mixed", {1: [(10.0, 5.0)]})
    vllm_bench_rate_tree(root, {2.0: [(50.0, 200.0)]})
    _one_line_error(root, "holds both concurrency_<CCC> and rate_<R> folders")


def test_an_unknown_layout_names_both_vllm_bench_forms(tmp_path: Path) -> None:
    with pytest.raises(ServelabError, match="rep_<NN>/rate_<R>/benchmark.json"):
        detect_layout(tmp_path)


def test_a_concurrency_tree_keeps_the_closed_loop_checks(tmp_path: Path) -> None:
    """A concurrency point of a run that also recorded vLLM's default rate and burstiness is
    read as before: its concurrency, the closed loop's checks, no arrival."""
    root = vllm_bench_tree(tmp_path / "c", {4: [(10.0, 5.0)]})
    bj = root / "rep_01" / "concurrency_004" / "benchmark.json"
    bj.write_text(
        json.dumps({**json.loads(bj.read_text()), "request_rate": "inf", "burstiness": 1.0})
    )
    p = load_dataset(root).points[0]
    assert (p.level.concurrency, p.level.rate, p.level.axis) == (4, None, "concurrency")
    assert "arrival" not in p.extra
    assert [f.check for f in p.checks] == [c.name for c in CHECKS]
