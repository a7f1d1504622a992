"""Validity checks on every point: recorded and constructed requests, and what a failed check
does to the tables, tests, claims, report and end-of-run summary."""

from __future__ import annotations

import copy
import csv
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from analysis_fixtures import servelab_point, vllm_bench_tree

from servelab.analysis.dataset import load_dataset
from servelab.analysis.pipeline import analysis_section, analyze
from servelab.analysis.validity import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    check_point,
    thresholds_json,
)
from servelab.client import RequestRecord
from servelab.config import default_section, load_yaml, schema_defaults, validate
from servelab.errors import ServelabError
from servelab.evidence.schemas import load_schema, schema_for
from servelab.experiment import ValiditySection
from servelab.store.jsonio import read_json, read_jsonl_gz
from servelab.summary import render_summary

DEFAULTS = default_section(ValiditySection, "analysis", "validity")
BURST_SAID = "4 of 4 requests delivered in one read (limit 5%)"
BUSY_SAID = "0.76 CPU cores busy outside the server, client and samplers (limit 0.25)"


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def by_check(flags: tuple[Flag, ...]) -> dict[str, Flag]:
    return {f.check: f for f in flags}


def recorded(fixtures: Path, rel: str) -> tuple[list[RequestRecord], dict[str, Any]]:
    d = fixtures / "validity" / "raw" / "max-num-seqs-1" / rel
    recs = [RequestRecord.from_json(r) for r in read_jsonl_gz(d / "requests.jsonl.gz")]
    return recs, dict(read_json(d / "point.json"))


def cpu_telemetry(
    host_pct: float, server_pct: float, client_pct: float = 3.0, steal_pct: float | None = None
) -> dict[str, Any]:
    """A point.json telemetry block for a 2-core host: host % of all cores, the rest % of one;
    with `steal_pct`, the host's steal % of all cores (a platform that reports steal time)."""
    block: dict[str, Any] = {
        "format_version": 1,
        "gpu": {"absent": "no GPU"},
        "cpu": {
            "samples": 8,
            "host_cpus": 2,
            "host_cpu_pct": {"mean": host_pct, "p95": host_pct, "max": host_pct},
            "server_cpu_pct": {"mean": server_pct, "p95": server_pct, "max": server_pct},
            "client_cpu_pct": {"mean": client_pct, "p95": client_pct, "max": client_pct},
            "telemetry_cpu_pct": {"mean": 1.0, "p95": 1.0, "max": 1.0},
            "server_error": None,
        },
        "server": {"samples": 4, "preemptions": 0.0},
    }
    if steal_pct is not None:
        block["cpu"]["host_steal_pct"] = {"mean": steal_pct, "p95": steal_pct, "max": steal_pct}
    return block


QUIET = cpu_telemetry(100.0, 192.0)  # 2 cores busy, 1.96 of them ours: 0.04 other
BUSY = cpu_telemetry(100.0, 120.0)  # 0.76 cores busy with something else


def three_repeats(exp: Path, sc: str, conc: int, tput: float, ttft: float, **rep2: Any) -> None:
    for rep in (1, 2, 3):
        kw = rep2 if rep == 2 else {}
        servelab_point(exp, sc, rep, conc, tput * (1 + 0.001 * rep), ttft, n=4, **kw)


# --- the checks on recorded requests -----------------------------------------------------------


def test_recorded_burst_point_fails_streaming(fixtures: Path) -> None:
    """max-num-seqs-1 rep02 c=2 of the published default run: 4 of its 8 requests got all 64
    tokens in one read (TTFT = E2EL, TPOT 0) on a CPU-starved 2-core host."""
    recs, meta = recorded(fixtures, "rep02/c0002")
    assert sum(1 for r in recs if len(set(r.chunk_offsets_us)) == 1) == 4
    f = by_check(check_point(recs, meta, DEFAULTS))
    s = f["streaming"]
    assert s.status == FAILED and s.value == 0.5 and s.threshold == 0.05
    assert s.reason == "4 of 8 requests delivered in one read (limit 5%)"
    # the same host was otherwise quiet: every other check passes
    assert f["contention"].status == PASSED and f["contention"].value is not None
    assert f["contention"].value < 0.1
    assert [f[k].status for k in ("failed_requests", "restarted_requests", "min_duration")] == [
        PASSED
    ] * 3


def test_recorded_streaming_point_passes(fixtures: Path) -> None:
    recs, meta = recorded(fixtures, "rep01/c0001")
    assert min(len(set(r.chunk_offsets_us)) for r in recs) > 2
    f = by_check(check_point(recs, meta, DEFAULTS))
    # recorded before the client kept per-chunk text and wait times: those checks say so
    unrecorded = {
        "first_token",
        "client_wait",
        "output_length",
        "prefix_cache",
        "leftover_requests",
    }
    assert all(x.status == PASSED for k, x in f.items() if k not in unrecorded | {"steady_state"})
    assert all(f[k].status == NOT_CHECKED for k in unrecorded), f
    # 4 requests: too few for the trend test
    steady = f["steady_state"]
    assert (steady.status, steady.reason) == (
        NOT_CHECKED,
        "4 successful requests: the trend test needs at least 10",
    )
    assert f["streaming"].reason == "0 of 4 requests delivered in one or two reads"
    assert f["min_duration"].reason.startswith("the point lasted 1.4")


def rec(i: int, offsets: list[int], tokens: int = 64, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        sent_epoch_ns=1_000_000_000_000 + i,
        chunk_offsets_us=offsets if ok else [],
        done_offset_us=(offsets[-1] + 10) if ok else 5,
        prompt_tokens=10,
        output_tokens=tokens if ok else None,
        ok=ok,
        error=None if ok else "HTTP 500: boom",
    )


def test_two_reads_count_as_burst_three_do_not_and_short_outputs_are_ignored() -> None:
    steady = [rec(i, list(range(1000, 1_400_000, 20_000))) for i in range(17)]
    two = rec(20, [5000] * 30 + [900_000] * 34)
    three = rec(21, [5000] * 20 + [400_000] * 20 + [1_500_000] * 24)
    tiny = rec(22, [5000, 5000, 5000], tokens=3)  # 3 tokens in one read prove nothing
    f = by_check(check_point([*steady, two, three, tiny], {}, DEFAULTS))["streaming"]
    assert (
        f.status == FAILED
        and f.reason == "1 of 19 requests delivered in one or two reads (limit 5%)"
    )
    f = by_check(check_point([*steady, three, tiny], {}, DEFAULTS))["streaming"]
    assert f.status == PASSED and f.value == 0.0
    only_tiny = by_check(check_point([tiny], {}, DEFAULTS))["streaming"]
    assert only_tiny.status == NOT_CHECKED
    assert only_tiny.reason == "no completed request with at least 4 output tokens"


def test_contention_trips_on_busy_host_not_on_quiet_one() -> None:
    recs = [rec(i, list(range(1000, 1_400_000, 20_000))) for i in range(4)]
    busy = by_check(check_point(recs, {"telemetry": BUSY}, DEFAULTS))["contention"]
    assert busy.status == FAILED and busy.value == pytest.approx(0.76)
    assert busy.reason == (
        "0.76 CPU cores busy outside the server, client and samplers (limit 0.25)"
    )
    quiet = by_check(check_point(recs, {"telemetry": QUIET}, DEFAULTS))["contention"]
    assert quiet.status == PASSED and quiet.value == pytest.approx(0.04)
    lax = replace(DEFAULTS, max_other_cpu_cores=1.0)
    assert by_check(check_point(recs, {"telemetry": BUSY}, lax))["contention"].status == PASSED
    # without telemetry it is not checked, and not failed
    for meta, why in [
        ({}, "no telemetry recorded"),
        ({"telemetry": {"enabled": False}}, "telemetry disabled"),
        ({"telemetry": {"cpu": {"absent": "psutil missing"}}}, "no CPU telemetry: psutil missing"),
    ]:
        f = by_check(check_point(recs, meta, DEFAULTS))["contention"]
        assert (f.status, f.reason) == (NOT_CHECKED, why)
    no_sample = copy.deepcopy(QUIET)
    no_sample["cpu"]["host_cpu_pct"] = {"mean": None, "p95": None, "max": None}
    f = by_check(check_point(recs, {"telemetry": no_sample}, DEFAULTS))["contention"]
    assert (f.status, f.reason) == (NOT_CHECKED, "no host CPU sample over the point")


def test_contention_says_how_much_was_hypervisor_steal() -> None:
    """Steal still counts (it takes CPU from the server): same value and outcome, and the
    message says how many of the cores were steal; a block without it keeps its message."""
    recs = [rec(i, list(range(1000, 1_400_000, 20_000))) for i in range(4)]

    def contention(tel: dict[str, Any], t: ValiditySection = DEFAULTS) -> Flag:
        return by_check(check_point(recs, {"telemetry": tel}, t))["contention"]

    plain = contention(BUSY)
    assert plain.reason == BUSY_SAID
    stolen = contention(cpu_telemetry(100.0, 120.0, steal_pct=26.0))  # 0.52 of 2 cores
    assert plain.status == FAILED and plain.value == pytest.approx(0.76)
    assert (stolen.status, stolen.value) == (plain.status, plain.value)
    assert stolen.reason == (
        "0.76 CPU cores busy outside the server, client and samplers "
        "(0.52 of them hypervisor steal) (limit 0.25)"
    )
    lax = replace(DEFAULTS, max_other_cpu_cores=1.0)
    passed = contention(cpu_telemetry(100.0, 120.0, steal_pct=0.0), lax)
    assert passed.status == PASSED and passed.value == pytest.approx(0.76)
    assert passed.reason == (
        "0.76 CPU cores busy outside the server, client and samplers (0.00 of them hypervisor steal)"
    )
    # steal is part of the cores outside ours: a mean from other samples never reads as more
    capped = contention(cpu_telemetry(100.0, 192.0, steal_pct=10.0))
    assert capped.status == PASSED and capped.reason == (
        "0.04 CPU cores busy outside the server, client and samplers (0.04 of them hypervisor steal)"
    )
    # a block without steal (an older servelab, a platform without it): today's message
    unknown = copy.deepcopy(BUSY)
    unknown["cpu"]["host_steal_pct"] = {"mean": None, "p95": None, "max": None}
    for tel in (BUSY, unknown):
        f = contention(tel)
        assert f.status == FAILED and f.value == pytest.approx(0.76)
        assert f.reason == plain.reason == BUSY_SAID


def test_failed_requests_short_points_and_preemptions() -> None:
    recs = [rec(i, list(range(1000, 1_400_000, 20_000))) for i in range(3)] + [rec(9, [], ok=False)]
    f = by_check(check_point(recs, {}, DEFAULTS))
    assert f["failed_requests"].status == FAILED
    assert f["failed_requests"].reason == "1 of 4 requests failed (limit 0; first: HTTP 500: boom)"
    one_ok = replace(DEFAULTS, max_failed_requests=1)
    assert by_check(check_point(recs, {}, one_ok))["failed_requests"].status == PASSED
    short = [rec(i, list(range(1000, 400_000, 20_000))) for i in range(4)]
    m = by_check(check_point(short, {}, DEFAULTS))["min_duration"]
    assert m.status == FAILED and m.reason == "the point lasted 0.38 s (minimum 1 s)"
    pre = copy.deepcopy(QUIET)
    pre["server"]["preemptions"] = 3.0
    r = by_check(check_point(recs[:3], {"telemetry": pre}, DEFAULTS))["restarted_requests"]
    assert r.status == NOTED and r.value == 3.0 and "preempted requests 3 times" in r.reason
    nothing = by_check(check_point([rec(0, [], ok=False)], {}, DEFAULTS))
    assert nothing["min_duration"].status == NOT_CHECKED


# --- what a failed check does to the analysis --------------------------------------------------


def test_burst_point_leaves_latency_out_but_keeps_throughput(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    three_repeats(exp, "x", 1, 100.0, 20.0, burst=4)
    three_repeats(exp, "x", 2, 180.0, 25.0)
    res = analyze(exp, tmp_path / "out", figures=False)
    s = {(r["concurrency"], r["metric"]): r for r in rows(tmp_path / "out" / "summary.csv")}
    assert s[("1", "output_throughput")]["n"] == "3"
    assert s[("1", "mean_e2el_ms")]["n"] == "3"
    for m in ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms"):
        assert s[("1", m)]["n"] == "2", m
    assert s[("1", "p99_ttft_ms")]["n"] == "0"  # a p99 of its few requests is never reported
    # the burst repeat's TTFT (= E2EL, 4 s) stays out of the mean of the two others (20 ms)
    assert float(s[("1", "mean_ttft_ms")]["mean"]) == pytest.approx(20.0)
    pts = {(r["concurrency"], r["repeat"]): r for r in rows(tmp_path / "out" / "points.csv")}
    bad = pts[("1", "2")]
    assert bad["valid"] == "false"
    assert bad["invalid_reasons"] == f"streaming: {BURST_SAID}"
    assert float(bad["mean_ttft_ms"]) == pytest.approx(4000.0, rel=0.01)  # raw value kept
    assert float(bad["mean_tpot_ms"]) == 0.0
    assert pts[("1", "1")]["valid"] == "true" and pts[("1", "1")]["invalid_reasons"] == ""
    cols = next(csv.reader(open(tmp_path / "out" / "points.csv")))
    assert cols[4:6] == ["valid", "invalid_reasons"]
    # the paired test names the reason instead of testing 2 repeats or "not testable"
    tpot = next(r for r in res.paired if r["metric"] == "mean_tpot_ms")
    assert tpot["verdict"] == f"invalid: rep02 c=1 x: {BURST_SAID}"
    assert tpot["p_value"] is None and tpot["n"] == 2
    tput = next(r for r in res.paired if r["metric"] == "output_throughput")
    assert tput["verdict"] == "a < b" and tput["n"] == 3


def test_contention_leaves_every_metric_out(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for rep, tel in ((1, QUIET), (2, BUSY), (3, QUIET)):
        servelab_point(exp, "x", rep, 1, 100.0, 20.0, n=4, telemetry=tel)
        servelab_point(exp, "x", rep, 2, 180.0, 25.0, n=4, telemetry=QUIET)
    res = analyze(exp, tmp_path / "out", figures=False)
    s = {(r["concurrency"], r["metric"]): r["n"] for r in res.summary}
    assert s[(1, "output_throughput")] == 2 and s[(1, "mean_ttft_ms")] == 2
    assert s[(1, "duration")] == 2 and s[(2, "output_throughput")] == 3
    bad = next(p for p in res.points if (p["concurrency"], p["repeat"]) == (1, 2))
    assert bad["valid"] is False and bad["invalid_reasons"].startswith("contention: 0.76 CPU")


def test_claims_over_invalid_points_read_invalid(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for c in (1, 2, 4, 8):
        three_repeats(exp, "x", c, 100.0, 20.0 * c, **({"burst": 4} if c == 1 else {}))
    claims = [
        "mean_ttft_ms[c=8] > mean_ttft_ms[c=1]",
        "mean_ttft_ms[c=8] > mean_ttft_ms[c=4]",
        "serialized(config=x)",
        "knee(config=x)",
    ]
    res = analyze(exp, tmp_path / "out", analysis_section({"claims": claims}), figures=False)
    got = {c["claim"]: c for c in json.loads((tmp_path / "out" / "claims.json").read_text())}
    first = got[claims[0]]
    assert first["verdict"] == "invalid"
    assert first["reason"] == f"invalid: rep02 c=1 x: {BURST_SAID}"
    assert first["evidence"]["invalid"] == [
        {
            "server_config": "x",
            "repeat": 2,
            "concurrency": 1,
            "check": "streaming",
            "reason": BURST_SAID,
        }
    ]
    assert got[claims[1]]["verdict"] == "holds"
    # a burst leaves throughput and duration intact: serialized is still decided
    assert got[claims[2]]["verdict"] == "holds"
    # the knee reads p99 TTFT at every level
    assert got[claims[3]]["verdict"] == "invalid"
    jsonschema.Draft202012Validator(load_schema("claims")).validate(res.claims)
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"| `{claims[0]}` | invalid: rep02 c=1 x: {BURST_SAID} |" in report


def test_report_section_and_validity_json(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    three_repeats(exp, "x", 1, 100.0, 20.0, burst=4)
    three_repeats(exp, "x", 2, 180.0, 25.0)
    analyze(exp, tmp_path / "out", figures=False)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Validity" in report
    assert (
        "| streaming | `analysis.validity.max_burst_share` = 0.05 | TTFT, TPOT, ITL | 5 | 1 | 0 | 0 |"
        in report
    )
    assert "1 of 6 points flagged:" in report
    assert f"| x | 2 | 1 | streaming | TTFT, TPOT, ITL | {BURST_SAID} |" in report
    assert "- contention: no telemetry recorded (6 points)" in report
    assert "| 1 | 3 | " in report and "20.0 ms (2 of 3)" in report
    doc = json.loads((tmp_path / "out" / "validity.json").read_text())
    jsonschema.Draft202012Validator(load_schema("validity")).validate(doc)
    assert schema_for("tables/validity.json") == "validity"
    assert doc["counts"]["streaming"] == {"passed": 5, "failed": 1, "noted": 0, "not checked": 0}
    assert [p["valid"] for p in doc["points"]] == [True, False, True, True, True, True]
    assert doc["thresholds"] == thresholds_json(DEFAULTS)

    clean = tmp_path / "clean"
    three_repeats(clean, "x", 1, 100.0, 20.0)
    analyze(clean, tmp_path / "out2", figures=False)
    assert "All 3 points passed every check." in (tmp_path / "out2" / "report.md").read_text()


def test_thresholds_are_analysis_options(tmp_path: Path) -> None:
    """Validity is a pure function of the raw data and the thresholds: re-analysing with a
    laxer threshold takes the point back."""
    exp = tmp_path / "exp"
    three_repeats(exp, "x", 1, 100.0, 20.0, burst=1)  # 1 of 4 requests
    strict = load_dataset(exp)
    assert [p.valid for p in strict.points] == [True, False, True]
    lax = analysis_section({"validity": {"max_burst_share": 0.25}})
    assert all(p.valid for p in load_dataset(exp, validity=lax.validity).points)
    res = analyze(exp, tmp_path / "out", lax, figures=False)
    s = {r["metric"]: r["n"] for r in res.summary}
    assert s["mean_ttft_ms"] == 3


def test_end_of_run_summary_line(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for rep, tel in ((1, QUIET), (2, BUSY), (3, QUIET)):
        servelab_point(exp, "x", rep, 1, 100.0, 20.0, n=4, telemetry=tel)
        servelab_point(exp, "x", rep, 2, 180.0, 25.0, n=4, telemetry=QUIET, burst=rep // 3)
    text = render_summary(exp)
    assert (
        "validity: 2 of 6 points flagged (streaming 1, contention 1); "
        "see analysis/report.md#validity"
    ) in text
    clean = tmp_path / "clean"
    for rep in (1, 2):
        servelab_point(clean, "x", rep, 1, 100.0, 20.0, n=4, telemetry=QUIET)
    said = render_summary(clean)
    assert "validity: all 2 points passed the 6 checks that could run; not checked: " in said
    assert "contention" not in said.split("not checked:")[1]
    bare = tmp_path / "bare"
    for rep in (1, 2):
        servelab_point(bare, "x", rep, 1, 100.0, 20.0, n=4)
    said = render_summary(bare)
    assert "validity: all 2 points passed the 5 checks that could run; not checked: " in said
    assert "contention" in said.split("not checked:")[1]


def test_vllm_bench_bursts_from_itls(tmp_path: Path) -> None:
    root = vllm_bench_tree(tmp_path / "bench", {1: [(100.0, 10.0)] * 3, 2: [(150.0, 12.0)] * 3})
    bench_file = root / "rep_02" / "concurrency_001" / "benchmark.json"
    bench = json.loads(bench_file.read_text())
    bench["itls"] = [[0.00001] * len(x) for x in bench["itls"]]  # every chunk in one read
    bench_file.write_text(json.dumps(bench))
    ds = load_dataset(root)
    flags = {(p.repeat, p.level.value): by_check(p.checks) for p in ds.points}
    assert flags[(2, 1)]["streaming"].status == FAILED
    assert flags[(2, 1)]["streaming"].reason == "2 of 2 requests delivered in one read (limit 5%)"
    assert flags[(1, 1)]["streaming"].status == PASSED
    assert flags[(1, 1)]["contention"].status == NOT_CHECKED
    assert flags[(1, 1)]["contention"].reason == "not recorded by vllm bench"


# --- config ------------------------------------------------------------------------------------


def test_defaults_come_from_the_schema(repo: Path) -> None:
    assert asdict(DEFAULTS) == schema_defaults("analysis", "validity")
    exp = validate(load_yaml(repo / "config" / "config.yaml"), "config.yaml")
    assert exp.analysis.validity == DEFAULTS
    assert exp.analysis.validity.max_burst_share == 0.05
    # validity.json records every threshold as a number, counts as integers
    written = thresholds_json(DEFAULTS)
    assert written["max_prompt_drift_pct"] == 5.0 and type(written["max_prompt_drift_pct"]) is float
    assert type(written["max_failed_requests"]) is int


@pytest.mark.parametrize(
    ("section", "msg"),
    [
        ({"max_bursts": 0.1}, r"analysis\.validity: .*'max_bursts' was unexpected"),
        ({"max_burst_share": 2}, r"analysis\.validity\.max_burst_share: 2 is greater than"),
        ({"max_other_cpu_cores": -1}, r"analysis\.validity\.max_other_cpu_cores: -1 is less than"),
    ],
)
def test_bad_thresholds_are_one_line_errors(repo: Path, section: dict[str, Any], msg: str) -> None:
    raw = load_yaml(repo / "config" / "config.yaml")
    raw["analysis"]["validity"] = section
    with pytest.raises(ServelabError, match=msg) as err:
        validate(raw, "config.yaml")
    assert "\n" not in str(err.value)


def test_config_schema_refuses_unknown_validity_key(repo: Path) -> None:
    raw = load_yaml(repo / "config" / "config.yaml")
    raw["analysis"]["validity"] = {"max_burst": 0.1}
    with pytest.raises(ServelabError, match=r"analysis\.validity: .*max_burst"):
        validate(raw, "config.yaml")


def test_recorded_fixture_analyses_end_to_end(fixtures: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    shutil.copytree(fixtures / "validity", exp)
    res = analyze(exp, tmp_path / "out", figures=False)
    by = {(p["repeat"], p["concurrency"]): p for p in res.points}
    assert by[(1, 1)]["valid"] is True
    assert by[(2, 2)]["invalid_reasons"] == (
        "streaming: 4 of 8 requests delivered in one read (limit 5%)"
    )
