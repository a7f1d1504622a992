"""client.schedule servelab: a tool handed servelab's own schedule of a rate point (AIPerf's
--fixed-schedule) instead of drawing its own, and what the analysis makes of its run; and what
Clients compared says of a tool that times TTFT at the first chunk with text."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.analysis.clients import Tool, run_clients, text_lag_cause
from servelab.analysis.dataset import Dataset, Point, PointExtra, TextLag
from servelab.analysis.groups import Groups
from servelab.analysis.schedules import handed_causes, rate_causes
from servelab.config import default_section, validate
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.errors import ServelabError
from servelab.experiment import ArrivalSection, ValiditySection
from servelab.measure.crosscheck import CrossCheck, Target, ToolPoint, command, dataset_file
from servelab.measure.sending import schedule_of
from servelab.metrics import text_lag
from servelab.store.paths import ExperimentPaths
from servelab.store.records import ArrivalsRecord
from servelab.store.request import RequestRecord

REPO = Path(__file__).resolve().parents[1]


def _config(**client: Any) -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["sweep"].pop("concurrency")
    cfg["sweep"]["rate"] = [1, 3]
    cfg["client"] = {"cross_check": ["aiperf"], "schedule": "servelab", **client}
    return cfg


def test_aiperf_is_handed_servelabs_send_times_and_told_to_keep_them(tmp_path: Path) -> None:
    arrival = ArrivalSection("poisson", 1.0, 4, 2.0)
    schedule = schedule_of(arrival, 2.5, 0)  # the sweep's own: workload.seed 0
    n = len(schedule.offsets_ns)
    prompts = [f"prompt {i}" for i in range(n)]
    point = ToolPoint("aiperf", Slot(1, Level.at_rate(2.5), 0, 0), prompts, tmp_path, schedule)
    data = dataset_file(point, 64)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    # each request's send time, in ms from the start, beside its prompt, in schedule order
    assert [r["timestamp"] for r in rows] == [t / 1e6 for t in schedule.offsets_ns]
    assert rows[0]["timestamp"] == 0.0 and rows[-1]["timestamp"] > rows[-2]["timestamp"] > 0
    assert rows[3] == {"text": "prompt 3", "output_length": 64, "timestamp": rows[3]["timestamp"]}
    t = Target("http://127.0.0.1:8000", "m", tmp_path / "tok", 64, True, 0, 60.0, arrival)
    cmd = command("aiperf", "/venv/bin/python", point, data, t)
    assert "--fixed-schedule" in cmd and "--request-rate" not in cmd
    assert "--arrival-pattern" not in cmd
    assert cmd[cmd.index("--concurrency") + 1] == "4"  # sweep.arrival.max_in_flight
    assert cmd[cmd.index("--request-count") + 1] == str(n)
    # a tool that takes no schedule is never handed one
    with pytest.raises(ValueError, match="guidellm takes no schedule"):
        command("guidellm", "/venv/bin/python", replace(point, tool="guidellm"), data, t)


@pytest.mark.parametrize(
    ("cfg", "named"),
    [
        (
            _config(cross_check=["aiperf", "guidellm", "vllm"]),
            "client.schedule servelab: guidellm, vllm take no schedule of send times (only "
            "aiperf does); leave them out or set client.schedule own",
        ),
        (
            {**_config(), "sweep": {"concurrency": [1, 2]}},
            "client.schedule servelab: a schedule is sent at a rate; give sweep.rate",
        ),
    ],
)
def test_the_config_refuses_a_schedule_where_it_cannot_be_handed(
    cfg: dict[str, Any], named: str
) -> None:
    with pytest.raises(ServelabError) as err:
        validate(cfg)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_handed_schedule_validates_and_defaults_to_each_tools_own() -> None:
    assert validate(_config()).client.schedule == "servelab"  # type: ignore[union-attr]
    cfg = _config()
    del cfg["client"]["schedule"]
    assert validate(cfg).client.schedule == "own"  # type: ignore[union-attr]


SCHEDULE = REPO / "tests" / "fixtures" / "tools" / "schedule"  # MADE.md: a real AIPerf run
SC = "max-num-seqs-8"


def test_aiperf_on_servelabs_schedule_reads_as_that_schedule() -> None:
    (run,) = run_clients(SCHEDULE, None)
    (tool,) = run.tools
    (point,) = tool.data.points
    arrival = point.extra["arrival"]
    # its profiling phase is fixed_schedule: send times handed to it, not a process it drew
    assert arrival["process"] == "schedule" and arrival["requests"] == 10
    # its own record of its schedule (each send less its wait) runs at servelab's rate
    ours = ArrivalsRecord.read(SCHEDULE / "raw" / SC / "arrivals" / "r0001.000.json")
    assert point.extra["offered_rate"] == pytest.approx(ours.doc["scheduled_rate"], rel=1e-3)
    (handed,) = tool.handed
    assert (handed.level, handed.repeat, handed.why) == (1.0, 1, None)
    # its k-th send against servelab's k-th scheduled send: about a millisecond late
    assert handed.p90_ms is not None and handed.max_ms is not None
    assert 0.0 < handed.p90_ms <= handed.max_ms < 5.0
    lines = rate_causes(Groups(tool.data), SC, tool.name, tool.data.points, 5.0, tool.handed)
    assert any(
        "sent on servelab's own schedule (client.schedule servelab)" in x
        and f"up to {handed.p90_ms:.1f} ms after them" in x
        for x in lines
    )
    # neither two draws nor another offered rate is said of one schedule
    assert not any("drew its own arrival times" in x or "offered a rate" in x for x in lines)


def test_a_schedule_that_is_not_the_runs_own_is_said(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SCHEDULE, run)
    client = run / "raw" / SC / "clients" / "aiperf" / "rep_01" / "rate_1" / "client.json"
    doc = json.loads(client.read_text())
    doc["schedule_sha256"] = "0" * 64
    client.write_text(json.dumps(doc))
    (found,) = run_clients(run, None)
    (handed,) = found.tools[0].handed
    assert handed.why == "the schedule handed is not r0001.000.json" and handed.p90_ms is None
    (run / "raw" / SC / "arrivals" / "r0001.000.json").unlink()
    (found,) = run_clients(run, None)
    assert found.tools[0].handed[0].why == "servelab's schedule r0001.000.json is missing"
    (line,) = handed_causes("AIPerf 0.13.0", found.tools[0].handed)
    assert "(not known: rate=1 rep 1: servelab's schedule r0001.000.json is missing)" in line
    # under a cap on requests in flight, a wait for a slot is part of how late a send went out
    (known,) = run_clients(SCHEDULE, None)[0].tools[0].handed
    (line,) = handed_causes("AIPerf 0.13.0", [known], capped=True)
    assert line.endswith(
        "over 1 run, a wait for a slot under the cap on requests in flight among it"
    )
    # a run that drew its own is not one handed a schedule
    del doc["schedule_sha256"]
    client.write_text(json.dumps(doc))
    (found,) = run_clients(run, None)
    assert not found.tools[0].handed


def test_text_lag_counts_the_chunks_of_output_before_the_first_with_text() -> None:
    def rec(empty: list[int] | None, tokens: list[int] | None, n: int = 4) -> RequestRecord:
        return RequestRecord("r", 0, list(range(0, 100 * n, 100)), ok=True, chunk_tokens=tokens,
                             empty_chunks=empty)  # fmt: skip

    # two tokens whose text the server held back: servelab's TTFT at chunk 0, text at chunk 2
    assert text_lag(rec([0, 1], [1, 1, 1, 1])) == 2
    # without per-chunk token counts servelab too waits for text: no lag between the two
    assert text_lag(rec([0, 1], None)) == 0
    assert text_lag(rec([], [1, 1, 1, 1])) == text_lag(rec(None, None)) == 0
    assert text_lag(rec([0, 1, 2, 3], [1, 1, 1, 1])) is None  # no text at all


def test_a_tool_that_times_ttft_at_text_is_set_beside_servelabs_requests(tmp_path: Path) -> None:
    def point(repeat: int, level: float, lag: TextLag | None) -> Point:
        extra: PointExtra = {} if lag is None else {"text_lag": lag}
        return Point("c", repeat, Level.at_rate(level), {}, extra=extra)

    ours = Dataset(
        "servelab",
        tmp_path,
        [
            point(1, 1.0, {"requests": 10, "lagged": 2, "most": 3, "no_text": 0}),
            point(2, 1.0, {"requests": 10, "lagged": 1, "most": 21, "no_text": 1}),
            point(1, 3.0, {"requests": 30, "lagged": 9, "most": 40, "no_text": 0}),  # not its
            point(3, 1.0, None),  # raw data written before the fact was kept
        ],
        {},
        default_section(ValiditySection, "analysis", "validity"),
    )
    theirs = Dataset("vllm-bench", tmp_path, [point(1, 1.0, None)], {}, ours.validity)
    (line,) = text_lag_cause(Groups(ours), "c", Tool("AIPerf 0.13.0", theirs, key="aiperf"))
    assert line.startswith("AIPerf 0.13.0: times TTFT at the first chunk with text (")
    assert (
        "of servelab's 20 completed requests at the levels it measured, 3 began with output "
        "streamed without text (up to 21 chunks before the first with text), whose TTFT it "
        "times that much later; 1 carried no text at all, which it counts as failed" in line
    )
    # vllm bench times TTFT at its first chunk, text or not, as servelab does
    assert text_lag_cause(Groups(ours), "c", Tool("vllm bench", theirs, key="vllm")) == []


def test_the_schedule_servelab_keeps_is_handed_only_under_client_schedule_servelab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[ArrivalsRecord | None] = []
    monkeypatch.setattr(CrossCheck, "run", lambda self, p, pos: handed.append(p.schedule))
    slot = Slot(1, Level.at_rate(1.0), 0, 0)
    ours = schedule_of(ArrivalSection("poisson", 1.0, None, 2.0), 1.0, 0)
    target = Target("http://127.0.0.1:8000", "m", tmp_path / "tok", 64, True, 0, 60.0)
    for schedule in ("servelab", "own"):
        exp = validate(_config(schedule=schedule))
        cross = CrossCheck(exp, "s", ExperimentPaths(tmp_path), {"aiperf": {}}, target, None, 1,
                           print)  # type: ignore[arg-type]  # fmt: skip
        cross.measure(slot, ["p"] * 2, None, ours)
    assert handed == [ours, None]  # the sweep's own record, never one drawn again
