"""Trace replay around the workload: the config keys (workload.trace with sweep.rate, nothing
else that gives prompts), a rate's schedule as the arrivals record keeps it, the fidelity
checks (trace_reuse, trace_requests), the sample trace's bytes and the one-line refusal of a
reproduction on another trace or window."""

from __future__ import annotations

import copy
import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab import config
from servelab.analysis.validity import FAILED, NOT_CHECKED, PASSED, RequestFacts, evaluate
from servelab.analysis.validity.facts import PointFacts
from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import TraceSection, ValiditySection
from servelab.measure.sending import Replay
from servelab.reproduce.comparison import _config_trace, other_trace
from servelab.store.records import ArrivalsRecord
from servelab.workload.trace import TraceRow, read_trace, schedule_ns, window

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "experiments" / "trace-replay-cpu.yaml"
SAMPLE = REPO / "datasets" / "mooncake-sample.jsonl"
SAMPLE_SHA256 = "48e8a12a546f16a7be56d623f50f62911d8a01addcb8f58d7fdeb22ae8601014"
T = default_section(ValiditySection, "analysis", "validity")


def example() -> dict[str, Any]:
    data = config.read_file(EXAMPLE)
    assert isinstance(data, dict)
    return data


def test_the_example_resolves_with_the_trace_and_without_lengths() -> None:
    exp = config.load(EXAMPLE)
    assert exp.workload.trace is not None
    assert exp.workload.trace.path == "datasets/mooncake-sample.jsonl"
    assert exp.workload.input_tokens is None and exp.workload.output_tokens is None
    assert exp.sweep.axis == "rate"
    resolved = config.resolve(example(), "example")
    assert "min_trace_reuse" not in resolved["analysis"]["validity"]


def closed_loop(d: dict[str, Any]) -> None:
    d["sweep"] = {k: v for k, v in d["sweep"].items() if k != "rate"} | {"concurrency": [1]}


def with_lengths(d: dict[str, Any]) -> None:
    d["workload"]["input_tokens"] = 128


def with_prefix(d: dict[str, Any]) -> None:
    d["workload"]["shared_prefix"] = {"prefixes": 1, "prefix_tokens": 8}


def not_unique(d: dict[str, Any]) -> None:
    d["workload"]["unique_prompts"] = False


def unpinned(d: dict[str, Any]) -> None:
    del d["workload"]["trace"]["sha256"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (closed_loop, "give sweep.rate"),
        (with_lengths, "workload.input_tokens: a trace gives"),
        (with_prefix, "workload.shared_prefix: a trace gives"),
        (not_unique, "unique_prompts: false does not apply"),
        (unpinned, "workload.trace.sha256: required with path: pin .* with sha256: 48e8"),
    ],
)
def test_a_trace_config_that_cannot_replay_is_refused_in_one_line(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = copy.deepcopy(example())
    change(data)
    with pytest.raises(ServelabError, match=message) as e:
        config.validate(data, "example")
    assert "\n" not in str(e.value)


def test_the_sample_trace_is_made_byte_for_byte_by_its_script(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_trace_sample.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == SAMPLE.read_bytes()
    assert hashlib.sha256(SAMPLE.read_bytes()).hexdigest() == SAMPLE_SHA256
    assert example()["workload"]["trace"]["sha256"] == SAMPLE_SHA256
    rows = read_trace(SAMPLE)
    assert len(rows) == 60 and rows[-1].timestamp < 60_000
    # every request's blocks cover its prompt, the last one partial (as in Mooncake's traces)
    assert all(len(r.hash_ids or ()) == -(-r.input_length // 128) for r in rows)


def test_a_rates_schedule_is_the_trace_at_its_time_scale_and_reads_back() -> None:
    spec = TraceSection(str(SAMPLE), None, SAMPLE_SHA256, 128, 0.0, 60.0)
    win = window(read_trace(SAMPLE), spec, 1024)
    assert win.recorded_rate == 1.0
    replay = Replay(win, SAMPLE_SHA256, 128)
    record = replay.schedule(3.0, 0, None)
    assert record.doc["process"] == "trace" and record.doc["time_scale"] == pytest.approx(1 / 3)
    assert record.offsets_ns == schedule_ns(win, 1 / 3)
    assert record.offsets_ns[5] == round(win.rows[5].timestamp * 1_000_000 / 3)
    again = ArrivalsRecord.from_json(record.doc, Path("arrivals/r0003.000.json"))
    assert again.doc == record.doc
    block = replay.point_block(2.0)
    assert block["time_scale"] == 0.5 and block["window"]["in_window"] == 60
    assert 0.4 < block["reuse"]["reuse_ratio"] < 0.6


def trace_facts(hit: float | None, *, sent: int = 60, caching: bool = True) -> PointFacts:
    reqs = tuple(
        RequestFacts(completed=True, output_tokens=8, reads=8, error=None, prompt_tokens=100)
        for _ in range(sent)
    )
    tel = None
    if hit is not None:
        tel = {"server": {"samples": 4, "prefix_cache_queries": 6000.0, "prefix_cache_hits": hit}}
    trace = {
        "sha256": SAMPLE_SHA256,
        "time_scale": 1.0,
        "window": {"in_window": 60, "requests": 58, "rejected": {"over_model_len": 2}},
        "reuse": {"reused_tokens": 3000, "reuse_ratio": 0.5},
    }
    args = {"enable-prefix-caching": caching}
    return PointFacts(reqs, 60.0, tel, rate=1.0, trace=trace, server_args=args, window_s=60.0)


def flags(f: PointFacts) -> dict[str, Any]:
    return {flag.check: flag for flag in evaluate(f, T)}


def test_the_reuse_the_server_achieved_is_judged_against_the_traces() -> None:
    ok = flags(trace_facts(3000.0))["trace_reuse"]
    assert ok.status == PASSED and ok.value == 1.0 and ok.threshold == 0.5
    low = flags(trace_facts(1200.0))["trace_reuse"]
    assert low.status == FAILED and low.value == pytest.approx(0.4)
    assert "1200 prompt tokens (server counters), 0.40 of the 3000 the trace implies" in low.reason
    off = flags(trace_facts(0.0, caching=False))["trace_reuse"]
    assert off.status == NOT_CHECKED and "did not enable prefix caching" in off.reason
    # the prefix_cache check notes the hits beside the share the trace implies
    noted = flags(trace_facts(3000.0))["prefix_cache"]
    assert "0.50 intended" in noted.reason


def test_a_window_sent_short_is_flagged_with_its_reasons() -> None:
    few = flags(trace_facts(3000.0, sent=58))["trace_requests"]
    assert few.status == PASSED and few.value == pytest.approx(100 * 2 / 60)
    assert few.reason == "58 of the window's 60 requests sent (left out: 2 over_model_len)"
    fewer = flags(trace_facts(3000.0, sent=50))["trace_requests"]
    assert fewer.status == FAILED
    plain = PointFacts((), 1.0, None, rate=1.0)
    assert "trace_reuse" not in flags(plain)  # an open loop without a trace: as before


PROV = {
    "file": {"source": "path", "path": "datasets/mooncake-sample.jsonl", "sha256": SAMPLE_SHA256},
    "window": {"start_s": 0.0, "duration_s": 60.0},
}


def test_a_reproduction_on_another_trace_or_window_is_refused_in_one_line() -> None:
    assert other_trace(PROV, copy.deepcopy(PROV)) is None
    assert other_trace(None, None) is None
    moved = copy.deepcopy(PROV)
    moved["window"]["start_s"] = 30.0
    why = other_trace(PROV, moved)
    assert why is not None and "\n" not in why
    assert "window 0.0 s + 60.0 s" in why and "window 30.0 s + 60.0 s" in why
    assert other_trace(PROV, None) is not None
    spec = {"path": "x.jsonl", "sha256": SAMPLE_SHA256, "start_s": 0, "duration_s": 60}
    assert _config_trace(PROV, spec) is None
    why = _config_trace(PROV, {**spec, "duration_s": 30})
    assert why is not None and "pin the reference's trace, window and fit" in why
    # a replay fitted otherwise (length_scale) is another workload; as recorded is the default
    why = _config_trace(PROV, {**spec, "length_scale": 0.5})
    assert why is not None and "length_scale 0.5" in why
    assert _config_trace(PROV, {**spec, "length_scale": 1, "over_limit": "drop"}) is None
    scaled = copy.deepcopy(PROV)
    scaled["window"]["fit"] = {"length_scale": 0.5, "max_output_tokens": None}
    assert other_trace(PROV, scaled) is not None and "length_scale 0.5" in str(
        other_trace(PROV, scaled)
    )
    assert _config_trace(scaled, {**spec, "length_scale": 0.5}) is None
    # the busiest window of the reference's length, in the same file
    assert _config_trace(PROV, {**spec, "busiest": 60, "start_s": None}) is None
    assert _config_trace(PROV, {**spec, "busiest": 30}) is not None
    assert _config_trace(PROV, {**spec, "sha256": "0" * 64}) is not None
    assert _config_trace(None, spec) is not None


def test_a_tampered_trace_stops_the_workflow_before_any_server_starts(tmp_path: Path) -> None:
    from workflow_env import config_errors

    tampered = tmp_path / "trace.jsonl"
    tampered.write_bytes(SAMPLE.read_bytes().replace(b'"output_length": 3', b'"output_length": 4'))
    cfg = copy.deepcopy(example())
    cfg["workload"]["trace"]["path"] = str(tampered)
    cfg["results_dir"] = str(tmp_path / "results")
    cfg_file = tmp_path / "tampered.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    errors = config_errors(cfg_file)
    assert len(errors) == 1, errors
    assert f"workload.trace.path {tampered}: sha256 is" in errors[0]
    assert f"the config pins {SAMPLE_SHA256}" in errors[0]
    assert not (tmp_path / "results").exists()  # nothing started


def test_provenance_holds_the_trace_its_window_and_every_rates_time_scale(tmp_path: Path) -> None:
    from servelab.evidence.replay import trace_part
    from servelab.store.jsonio import write_json
    from servelab.store.paths import ExperimentPaths

    spec = TraceSection(str(SAMPLE), None, SAMPLE_SHA256, 128, 0.0, 60.0)
    win = window(read_trace(SAMPLE), spec, 1024)
    replay = Replay(win, SAMPLE_SHA256, 128)
    paths = ExperimentPaths(tmp_path)
    record = {
        "format_version": 1,
        "file": {"source": "path", "path": "datasets/mooncake-sample.jsonl",
                 "sha256": SAMPLE_SHA256, "bytes": SAMPLE.stat().st_size},
        "seed": 0,
        "block_tokens": 128,
        "window": win.record(),
        "rows": 60,
    }  # fmt: skip
    for sc in ("a", "b"):
        paths.raw_config(sc).mkdir(parents=True)
        write_json(paths.trace(sc), record)
        for rate in (1.0, 3.0):
            path = paths.arrivals(sc, rate)
            path.parent.mkdir(parents=True, exist_ok=True)
            replay.schedule(rate, 0, None).write(path)
    part = trace_part(paths)["trace"]
    assert part["file"]["sha256"] == SAMPLE_SHA256 and part["window"]["duration_s"] == 60.0
    assert part["time_scales"] == {"1": 1.0, "3": pytest.approx(1 / 3)}
    write_json(paths.trace("b"), {**record, "window": {**record["window"], "start_s": 5.0}})
    with pytest.raises(ServelabError, match="another trace or window"):
        trace_part(paths)


def test_the_report_gives_each_rates_time_scale_send_slip_and_reuse_served() -> None:
    from types import SimpleNamespace

    from servelab.analysis.replay_report import replay_section
    from servelab.analysis.validity import Flag
    from servelab.design.level import Level

    def point(rate: float, slip: float, reuse: float | None) -> Any:
        trace = {
            "time_scale": 1 / rate,
            "window": {"requests": 60, "in_window": 60},
            "reuse": {"reused_tokens": 15616},
        }
        flags = (
            Flag("send_slip", PASSED, slip, 150.0, ""),
            Flag("trace_reuse", NOT_CHECKED if reuse is None else PASSED, reuse, 0.5, ""),
        )
        return SimpleNamespace(level=Level.at_rate(rate), extra={"trace": trace}, checks=flags)

    g: Any = SimpleNamespace(
        by={
            ("on", 2.0): {1: point(2.0, 4.0, 1.0), 2: point(2.0, 9.5, 0.98)},
            ("off", 1.0): {1: point(1.0, 3.0, None)},
        }
    )
    lines = replay_section(g)
    assert lines[0] == "## Trace replay"
    assert "| on | 2 | 0.5 | 60 of 60 | 4.0-9.5 | 15616 | 0.98-1.00 |" in lines
    assert "| off | 1 | 1 | 60 of 60 | 3.0 | 15616 | - |" in lines
    assert replay_section(SimpleNamespace(by={("a", 1.0): {1: SimpleNamespace(extra={})}})) == []


def test_the_report_gives_the_window_as_recorded_against_as_replayed() -> None:
    from types import SimpleNamespace

    from servelab.analysis.replay_report import fidelity_tables

    rows = [TraceRow(i * 500, 2000 + 100 * i, 40, (1, 2, 3, 4), i + 1) for i in range(20)]
    spec = TraceSection("t", None, None, 512, 0.0, 10.0, length_scale=0.25, over_limit="truncate")
    win = window(rows, spec, 1024)
    trace = {"time_scale": 1.0, "window": win.record(), "reuse": {}}
    g: Any = SimpleNamespace(
        by={("a", 2.0): {1: SimpleNamespace(extra={"trace": trace})},
            ("b", 2.0): {1: SimpleNamespace(extra={"trace": trace})}}
    )  # fmt: skip
    lines = fidelity_tables(g)
    assert lines[0] == "### The window replayed (a, b)"  # one table: both replayed one window
    assert "window 0-10 s: 20 of 20 kept, lengths x 0.25 (block 128 tokens)" in lines[2]
    # 2000-3900 tokens x 1/4 = 500-975; outputs 40 -> 10; 20 requests over 10 s
    assert "| Requests | 20 | 20 (100.0%) |" in lines
    assert "| Rate (req/s, as recorded) | 2 | 2 |" in lines
    assert "| Input p50 / p90 (tokens) | 2900 / 3700 | 725 / 925 |" in lines
    assert "| Output p50 / p90 (tokens) | 40 / 40 | 10 / 10 |" in lines
    # every request after the first reuses the same four blocks: 19 x 2048 of the tokens
    reuse = [line for line in lines if line.startswith("| Implied reuse")][0]
    assert "(512-token blocks)" in reuse and "(128-token blocks)" in reuse
    before, after = (float(c.split()[0]) for c in reuse.strip("|").split("|")[1:])
    assert before == pytest.approx(19 * 2048 / sum(2000 + 100 * i for i in range(20)), abs=1e-3)
    assert after == pytest.approx(before, abs=0.01)
    old = {"time_scale": 1.0, "window": {"requests": 3, "in_window": 3}, "reuse": {}}
    assert (
        fidelity_tables(
            SimpleNamespace(by={("a", 1.0): {1: SimpleNamespace(extra={"trace": old})}})
        )
        == []
    )


def test_trace_requests_allows_what_min_kept_allows_unless_the_config_sets_a_limit() -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from servelab.analysis.validity.replay import check_trace_requests

    window_ = {"in_window": 100, "requests": 90, "rejected": {"over_model_len": 10},
               "fit": {"min_kept": 0.9}}  # fmt: skip
    facts: Any = SimpleNamespace(trace={"window": window_}, requests=[{}] * 90)
    unset = replace(T, max_trace_missing_pct=None)
    flag = check_trace_requests(facts, unset)
    assert flag.status == PASSED and flag.threshold == pytest.approx(10.0), flag
    assert "90 of the window's 100 requests sent (left out: 10 over_model_len)" in flag.reason
    strict = replace(T, max_trace_missing_pct=5.0)
    assert check_trace_requests(facts, strict).status == FAILED
    facts.requests = [{}] * 85  # 5 more never sent: 15% missing, over min_kept's 10%
    assert check_trace_requests(facts, unset).status == FAILED
