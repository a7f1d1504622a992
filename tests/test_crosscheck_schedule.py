"""client.schedule servelab: a tool handed servelab's own schedule of a rate point (AIPerf's
--fixed-schedule) instead of drawing its own, and what the analysis makes of its run."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.analysis.clients import run_clients
from servelab.analysis.groups import Groups
from servelab.analysis.schedules import handed_causes, rate_causes
from servelab.config import validate
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.errors import ServelabError
from servelab.experiment import ArrivalSection
from servelab.measure.crosscheck import Target, ToolPoint, command, dataset_file
from servelab.measure.sending import schedule_of
from servelab.store.records import ArrivalsRecord

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
