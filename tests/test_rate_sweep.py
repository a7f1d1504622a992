"""Sweeps over request rates (sweep.rate, sweep.arrival): the config, the plan and the raw
layout, the schedule's record, the open-loop validity checks, and the analysis of an open-loop
raw tree with known answers (claims with rate=R, bounds, the knee in rate). The real server's
end-to-end run is tests/test_rate_sweep_e2e.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.analysis.pipeline import analyze
from servelab.analysis.validity import OPEN_LOOP_CHECKS, PointFacts, RequestFacts
from servelab.analysis.validity.openloop import (
    check_arrival_rate,
    check_cap_reached,
    check_send_slip,
    held_by_cap,
)
from servelab.config import default_section, validate
from servelab.design.arrivals import ArrivalProcess, schedule_sha256
from servelab.design.schedule import plan
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection, ValiditySection
from servelab.store.jsonio import write_json, write_jsonl_gz
from servelab.store.paths import ExperimentPaths, rate_dir
from servelab.store.records import ArrivalsRecord, DamagedRawData, PointRecord

REPO = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000_000_000_000
V = default_section(ValiditySection, "analysis", "validity")


def _base() -> dict[str, Any]:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def _with_sweep(sweep: dict[str, Any]) -> dict[str, Any]:
    cfg = _base()
    cfg["sweep"] = sweep
    return cfg


# --- the config ---------------------------------------------------------------------------


def test_a_rate_sweep_fills_the_arrival_defaults_and_a_concurrency_sweep_has_none() -> None:
    exp = validate(_with_sweep({"rate": [0.5, 2]}))
    assert exp.sweep.axis == "rate" and exp.sweep.levels == (0.5, 2.0)
    assert exp.sweep.arrival is not None and exp.sweep.arrival.process == "poisson"
    assert exp.sweep.arrival.requests(0.5) == 15 and exp.sweep.arrival.requests(2) == 60
    closed = validate(_base())
    assert closed.sweep.axis == "concurrency" and closed.sweep.arrival is None
    # the resolved config of a concurrency sweep is as it was before rates existed
    assert set(closed.to_dict()["sweep"]) == {"concurrency", "repeats", "order", "order_seed"}


@pytest.mark.parametrize(
    ("sweep", "needle"),
    [
        ({"concurrency": [1], "rate": [1]}, "sweep: give either concurrency"),
        ({"repeats": 2}, "sweep: give either concurrency"),
        ({"concurrency": [1], "arrival": {"process": "constant"}}, "sweep.arrival: applies to"),
        ({"rate": [1.0005]}, "sweep.rate[0]: 1.0005 has more than three decimals"),
        ({"rate": [1], "arrival": {"burstiness": 0.5}}, "applies to process gamma only"),
        ({"rate": [0]}, "sweep.rate[0]"),
        ({"rate": [1], "arrival": {"process": "bursty"}}, "sweep.arrival.process"),
    ],
)
def test_bad_rate_sweeps_are_one_line_errors(sweep: dict[str, Any], needle: str) -> None:
    with pytest.raises(ServelabError) as err:
        validate(_with_sweep(sweep), "exp.yaml")
    assert needle in str(err.value) and "\n" not in str(err.value)


# --- the plan, the layout, the schedule ------------------------------------------------------


def test_rate_slots_name_their_folders_and_the_layout_finds_only_complete_ones(
    tmp_path: Path,
) -> None:
    slots = plan([0.25, 12.5], 2, "latin", axis="rate")
    paths = ExperimentPaths(tmp_path)
    assert [paths.slot("a", s).relative_to(tmp_path).as_posix() for s in slots[:2]] == [
        "raw/a/rep01/r0000.250",
        "raw/a/rep01/r0012.500",
    ]
    assert rate_dir(1234.5) == "r1234.500" and rate_dir(12345) == "r12345.000"
    for s in slots:
        d = paths.slot("a", s)
        d.mkdir(parents=True)
        (d / "point.json").write_text("{}")
    stale = paths.slot("a", slots[0]).with_name("r0000.250.partial")
    stale.mkdir()
    (stale / "point.json").write_text("{}")
    assert len(paths.point_files()) == 4


def test_the_schedule_record_round_trips_and_refuses_edited_send_times(tmp_path: Path) -> None:
    rec = ArrivalsRecord.of(ArrivalProcess("poisson", 2.0, seed=7), 50, 4)
    path = tmp_path / "r0002.000.json"
    rec.write(path)
    back = ArrivalsRecord.read(path)
    assert back.doc == rec.doc and len(back.offsets_ns) == 50 and back.offsets_ns[0] == 0
    assert back.summary()["schedule_sha256"] == schedule_sha256(back.offsets_ns)
    # the same process and seed draw the same schedule: a rerun or a reproduction checks it
    assert ArrivalsRecord.of(ArrivalProcess("poisson", 2.0, seed=7), 50, 4).doc == rec.doc
    doc = json.loads(path.read_text())
    doc["offsets_ns"][3] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(DamagedRawData, match="do not match schedule_sha256"):
        ArrivalsRecord.read(path)


def test_a_point_needs_a_level(tmp_path: Path) -> None:
    doc = {"format_version": 1, "status": "complete", "server_config": "a", "repeat": 1}
    write_json(tmp_path / "point.json", doc)
    with pytest.raises(DamagedRawData, match="concurrency or rate"):
        PointRecord.read(tmp_path / "point.json")
    write_json(tmp_path / "point.json", {**doc, "rate": 2.5})
    assert PointRecord.read(tmp_path / "point.json").rate == 2.5


# --- the open-loop validity checks -----------------------------------------------------------


def _req(due_ms: float, slip_ms: float, dur_ms: float) -> RequestFacts:
    due = T0 + int(due_ms * 1e6)
    return RequestFacts(
        completed=True,
        output_tokens=8,
        reads=8,
        error=None,
        scheduled_ns=due,
        send_slip_us=int(slip_ms * 1000),
        end_ns=due + int(dur_ms * 1e6),
    )


def _facts(reqs: list[RequestFacts], rate: float, cap: int | None = None) -> PointFacts:
    due = sorted(int(r.scheduled_ns or 0) for r in reqs)
    scheduled = (len(due) - 1) / ((due[-1] - due[0]) / 1e9)
    arrival = {"max_in_flight": cap, "scheduled_rate": scheduled}
    return PointFacts(tuple(reqs), 1.0, None, rate=rate, arrival=arrival)


def test_a_client_on_schedule_passes_and_one_that_fell_behind_fails() -> None:
    on_time = _facts([_req(100 * i, 0.3, 50) for i in range(20)], 10.0)
    assert check_arrival_rate(on_time, V).status == "passed"
    assert check_send_slip(on_time, V).status == "passed"
    # every send 30 ms later than the one before: sent at 1000/130 = 7.7 req/s, not 10
    behind = _facts([_req(100 * i, 30 * i, 50) for i in range(20)], 10.0)
    rate = check_arrival_rate(behind, V)
    assert rate.status == "failed" and rate.value == pytest.approx(23.08, abs=0.1)
    slip = check_send_slip(behind, V)
    assert slip.status == "failed" and slip.value == pytest.approx(510.0)  # p90: the 18th of 20
    # one hiccup among thirty sends leaves the arrival process as it was
    hiccup = _facts([_req(100 * i, 350.0 if i == 7 else 0.5, 50) for i in range(30)], 10.0)
    flag = check_send_slip(hiccup, V)
    assert flag.status == "passed" and "max 350" in flag.reason


def test_waits_for_the_cap_are_the_caps_not_the_clients() -> None:
    """Cap 1 and requests that take 150 ms every 100 ms: from the second on, each is due while
    the one before is in flight, and waits; the slip check leaves those out, the cap check
    notes them, and a closed loop's checks do not apply."""
    # cap 1: each sent when the one before ends (150 ms after its own send), 50 ms later each
    reqs = [_req(0, 0.2, 150)] + [_req(100 * i, 50 * i, 150 + 50 * i) for i in range(1, 10)]
    f = _facts(reqs, 10.0, cap=1)
    assert held_by_cap(f) == [False] + [True] * 9
    slip = check_send_slip(f, V)
    assert slip.status == "passed" and "not counting 9 the cap held back" in slip.reason
    cap = check_cap_reached(f, V)
    assert cap.status == "noted" and cap.value == pytest.approx(0.9)
    assert check_cap_reached(_facts(reqs, 10.0), V).status == "not checked"
    closed = PointFacts(tuple(reqs), 1.0, None, concurrency=4)
    assert check_arrival_rate(closed, V).status == "not checked"


# --- the analysis of an open-loop tree -------------------------------------------------------


def open_point(exp: Path, sc: str, rep: int, rate: float, service_ms: float, n: int = 20) -> None:
    """n requests on a Poisson schedule at `rate`, each answered in `service_ms` after its
    scheduled send (8 tokens, evenly), the client on time (slip 0.2 ms)."""
    sched = ArrivalsRecord.of(ArrivalProcess("poisson", rate, seed=0), n, None)
    start = T0 + rep * 10**12 + int(rate * 1000) * 10**9
    done_us = int(service_ms * 1000)
    ttft_us = done_us // 8
    reqs = [
        {
            "request_id": f"{sc}-{rep}-{rate}-{i:05d}",
            "sent_epoch_ns": start + t,
            "chunk_offsets_us": [ttft_us + k * (done_us - ttft_us) // 7 for k in range(8)],
            "done_offset_us": done_us,
            "prompt_tokens": 10,
            "output_tokens": 8,
            "ok": True,
            "error": None,
            "http_status": 200,
            "send_slip_us": 200,
        }
        for i, t in enumerate(sched.offsets_ns)
    ]
    d = ExperimentPaths(exp).rate_point(sc, rep, rate)
    write_jsonl_gz(d / "requests.jsonl.gz", reqs)
    end = start + sched.offsets_ns[-1] + done_us * 1000
    point = {
        "format_version": 1,
        "status": "complete",
        "server_config": sc,
        "repeat": rep,
        "rate": rate,
        "arrival": sched.summary(),
        "kind": "measured",
        "num_prompts": n,
        "client_cpu_s": 0.1,
        "started_epoch_ns": start,
        "finished_epoch_ns": end,
        "completed": n,
        "failed": 0,
        "duration": (end - start) / 1e9,
    }
    write_json(d / "point.json", point)


def _analysis(claims: list[str]) -> AnalysisSection:
    base = copy.deepcopy(_base())
    base["analysis"] = {"claims": claims, "validity": {"min_point_duration_s": 0}}
    return validate(base).analysis


def test_an_open_loop_tree_is_analysed_by_rate(tmp_path: Path) -> None:
    """Latency grows with the rate (service 100, 200, 800 ms at 1, 2, 4 req/s) and the
    throughput follows the offered rate: claims name rates, a bound holds where the
    confidence bound is below it, and the tables call the level `rate`."""
    exp = tmp_path / "exp"
    for rep, jitter in ((1, 0.0), (2, 5.0), (3, -5.0)):
        for rate, service in ((1.0, 100), (2.0, 200), (4.0, 800)):
            open_point(exp, "a", rep, rate, service + jitter)
    claims = [
        "mean_ttft_ms[rate=4] > 2 * mean_ttft_ms[rate=1]",
        "throughput[rate=2] > 1.5 * throughput[rate=1]",
        "mean_ttft_ms[rate=1] < 50",
        "mean_ttft_ms[rate=4] < 50",
        "mean_e2el_ms[rate=2] > 150",
        # a point's few requests cannot report a p99: no verdict either way
        "p99_ttft_ms[rate=4] > 2 * p99_ttft_ms[rate=1]",
    ]
    out = tmp_path / "analysis"
    results = analyze(exp, out, _analysis(claims), figures=False)
    verdicts = [c["verdict"] for c in results.claims]
    assert verdicts == ["holds", "holds", "holds", "fails", "holds", "inconclusive"]
    assert results.claims[5]["reason"].startswith(
        "insufficient: rate=4 a (n = 20 in 3 of 3 repeats"
    )
    bound = results.claims[2]["evidence"]
    assert bound["a"]["rate"] == 1.0 and bound["confidence_bounds"][1] < 50
    header = (out / "points.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["server_config", "repeat", "rate"]
    assert "concurrency" not in header
    assert (out / "summary.csv").read_text().splitlines()[0].startswith("server_config,rate,")
    validity = json.loads((out / "validity.json").read_text())
    names = [c["name"] for c in validity["checks"]]
    assert [c.name for c in OPEN_LOOP_CHECKS] == names[-3:]
    assert "achieved_concurrency" not in names and "max_send_slip_ms" in validity["thresholds"]
    assert validity["points"][0]["rate"] == 1.0
    assert all(p["valid"] for p in validity["points"])
    assert results.knee[0]["server_config"] == "a" and "rate" in results.knee[0]
    report = (out / "report.md").read_text()
    assert "## Throughput by request rate" in report and "R1 vs R2" in report


def test_a_claim_on_a_rate_sweep_names_rates(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for rep in (1, 2):
        for rate in (1.0, 2.0):
            open_point(exp, "a", rep, rate, 100)
    with pytest.raises(ServelabError, match="selectors of a sweep over request rates are rate=N"):
        analyze(exp, tmp_path / "o", _analysis(["throughput[c=2] > throughput[c=1]"]), False)
    with pytest.raises(ServelabError, match="request rate 3 was not measured"):
        analyze(exp, tmp_path / "o", _analysis(["throughput[rate=3] > throughput[rate=1]"]), False)


def test_a_closed_loop_tree_keeps_its_validity_record(tmp_path: Path) -> None:
    """The open-loop checks and thresholds appear only where points are open-loop."""
    from analysis_fixtures import servelab_tree

    exp = servelab_tree(tmp_path / "exp", {"a": {1: [(10.0, 5.0)], 2: [(18.0, 6.0)]}})
    analyze(exp, tmp_path / "o", _analysis([]), figures=False)
    validity = json.loads((tmp_path / "o" / "validity.json").read_text())
    names = {c["name"] for c in validity["checks"]}
    assert names.isdisjoint(c.name for c in OPEN_LOOP_CHECKS)
    assert "max_send_slip_ms" not in validity["thresholds"]
    assert validity["points"][0]["concurrency"] == 1


# --- the SLO capacity search's config and claim -------------------------------------------------


def test_the_search_needs_a_bound_and_configurations_that_exist() -> None:
    cfg = _base()
    cfg["search"] = {"enabled": True}
    with pytest.raises(ServelabError, match="search.enabled: the search needs a bound"):
        validate(cfg, "exp.yaml")
    cfg["analysis"]["slo"] = {"p99_ttft_ms": 500}
    cfg["search"]["server_configs"] = ["nope"]
    with pytest.raises(ServelabError, match=r"search.server_configs\[0\]: 'nope' is not in"):
        validate(cfg, "exp.yaml")
    cfg["search"]["server_configs"] = ["max-num-seqs-8"]
    assert validate(cfg).searched == ["max-num-seqs-8"]
    assert validate(_base()).searched == []


@pytest.mark.parametrize(
    ("claim", "verdict", "at_4"),
    [
        ("slo_capacity(config=a) > 3", "holds", "fails"),  # 3.5 met
        ("slo_capacity(config=a) > 3.5", "inconclusive", "fails"),  # inside [3.5, 4)
        ("slo_capacity(config=a) > 4", "fails", "fails"),  # 4 failed
        ("slo_capacity(config=a) < 4", "holds", "fails"),
        ("slo_capacity(config=a) < 3.5", "fails", "fails"),
        ("slo_capacity(config=a) < 3.75", "inconclusive", "fails"),
        # 4 undecided: the bracket's end, but no evidence that the capacity is below it
        ("slo_capacity(config=a) > 4", "inconclusive", "undecided"),
        ("slo_capacity(config=a) < 4", "inconclusive", "undecided"),
        ("slo_capacity(config=a) < 5", "holds", "undecided"),  # 5 failed
        ("slo_capacity(config=a) > 3", "holds", "undecided"),
    ],
)
def test_a_claim_on_the_search_reads_its_bracket(
    tmp_path: Path, claim: str, verdict: str, at_4: str
) -> None:
    from servelab.analysis.claims import Findings, evaluate_claims
    from servelab.analysis.dataset import load_dataset
    from servelab.analysis.groups import Groups

    exp = tmp_path / "exp"
    open_point(exp, "a", 1, 1.0, 100)
    g = Groups(load_dataset(exp))
    answer = {"met_rate": 3.5, "failed_rate": 4.0, "stopped": "converged", "reason": None}
    decided = [(2, "meets"), (5, "fails"), (3, "meets"), (4, at_4), (3.5, "meets")]
    path = [{"rate": r, "decision": d} for r, d in decided]
    found = Findings([], [], [], {"a": {"answer": answer, "path": path}})
    (out,) = evaluate_claims(g, _analysis([claim]), found)
    assert out["verdict"] == verdict and out["evidence"]["met_rate"] == 3.5
    with pytest.raises(ServelabError, match="no SLO capacity search of a"):
        evaluate_claims(g, _analysis([claim]), Findings([], [], []))


def test_the_busiest_client_worker_decides_the_client_cpu_check() -> None:
    from servelab.analysis.validity.pitfalls import check_client_cpu

    calm = PointFacts((), 1.0, None, worker_busy=(0.4, 0.5))
    flag = check_client_cpu(calm, V)
    assert flag.status == "passed" and flag.value == 0.5 and "worker 2" in flag.reason
    busy = PointFacts((), 1.0, None, worker_busy=(0.97, 0.5))
    flag = check_client_cpu(busy, V)
    assert flag.status == "failed" and "worker 1" in flag.reason


def test_a_reproduction_judges_a_claim_on_the_search(tmp_path: Path) -> None:
    """A side's SLO capacity search (raw/<sc>/search/search.json) reaches the claims a
    reproduction re-evaluates, as it reaches the analysis' own."""
    from servelab.analysis.dataset import load_dataset
    from servelab.analysis.search import (
        RateOutcome,
        RepeatOutcome,
        SearchSpec,
        SloBounds,
        search_rate,
    )
    from servelab.analysis.search_records import write_search
    from servelab.reproduce.checks import _claim, analyse

    exp = tmp_path / "exp"
    open_point(exp, "a", 1, 1.0, 100)

    def measure(rate: float, round_: int) -> RateOutcome:
        return RateOutcome((RepeatOutcome(1.0 if rate <= 3.7 else 0.5, True, 400),))

    result = search_rate(measure, SearchSpec(2, SloBounds(ttft_ms=500), target=0.99))
    write_search(ExperimentPaths(exp).search("a") / "search.json", result)
    opts = _analysis([])
    side = analyse(load_dataset(exp), opts)
    assert side.searches["a"]["answer"]["met_rate"] == result.to_json()["answer"]["met_rate"]
    assert _claim(side, opts, "slo_capacity(config=a) > 3")["verdict"] == "holds"
    assert _claim(side, opts, "slo_capacity(config=a) > 4")["verdict"] == "fails"
