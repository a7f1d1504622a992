"""The end-of-run summary of a sequential sweep: where the time of its one `sweep` stage went,
round by round, from the raw data the round-by-round loop (servelab.measure.sequential.run_rounds)
writes; measuring is stubbed out by launches and points written from known values on a fake
clock, so every second in the summary is known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import servelab_point
from experiment_fixtures import measure_job
from test_rounds import CLEAR, MEANS, NULL, SHAPE, experiment

from servelab.design.schedule import plan
from servelab.measure import sequential as rounds_mod
from servelab.measure.sweep import SweepJob, next_launch_index
from servelab.store.jsonio import write_json
from servelab.store.records import LaunchRecord
from servelab.summary import render_summary

# each launch's start (ready_s) by configuration and launch index; b's first launch waited
# 12 s for the host's measuring-server lock
READY = {
    ("a", 1): 30.0,
    ("b", 1): 31.5,
    ("a", 2): 20.5,
    ("b", 2): 21.0,
    ("a", 3): 19.0,
    ("b", 3): 19.5,
    ("a", 4): 18.0,
    ("b", 4): 18.5,
    ("a", 5): 17.0,
    ("b", 5): 17.5,
}
LOCK = {("b", 1): 12.0}
OTHER_S = 5.0  # per launch: prompts, warm-up, shutdown
LOOKS_S = 7.0  # the stage's time outside its steps of rounds: the looks, the job's own


class Clock:
    """servelab.measure.sequential's `time`: a monotonic clock the stub's launches alone advance."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def stub_measuring(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """SweepJob.measure_missing, stubbed as a sweep measures: one launch (launch.json, the
    next index) for the points of rounds 1..repeats not complete yet, each point recording
    its launch; every point the same throughput (MEANS) in every round, so its duration is
    2c requests x 100 tokens / throughput (a: 2 + 8 s a round, b: 4 + 16 s). The clock moves
    by the launch's start, OTHER_S and its points' durations."""

    def fake(job: SweepJob, repeats: int) -> Any:
        sc, root = job.sc, job.paths.root
        todo = [
            r for r in range(1, repeats + 1) if not (root / "raw" / sc / f"rep{r:02d}").is_dir()
        ]
        if todo:
            n = next_launch_index(job.server_dir)
            LaunchRecord.new(
                {
                    "launch": n,
                    "server_config": sc,
                    "command": ["vllm", "serve"],
                    "env": {},
                    "args": {},
                    "port": 8000,
                    "started_epoch_ns": 0,
                    "ready_s": READY[(sc, n)],
                    "lock": {"path": "/l", "waited_s": LOCK.get((sc, n), 0.0), "holder": None},
                }
            ).write(job.paths.launch(sc))
            clock.now += READY[(sc, n)] + OTHER_S
            for r in todo:
                for (cell_sc, c), tput in sorted(MEANS.items()):
                    if cell_sc == sc:
                        point = servelab_point(root, sc, r, c, tput, 100.0)
                        folder = root / "raw" / sc / f"rep{r:02d}" / f"c{c:04d}"
                        write_json(folder / "point.json", {**point, "launch": n})
                        clock.now += point["duration"]
        sw = job.exp.sweep
        return plan(sw.concurrency, repeats, sw.order, sw.order_seed)

    monkeypatch.setattr(SweepJob, "measure_missing", fake)
    monkeypatch.setattr(rounds_mod, "time", clock)


def measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claims: list[str]) -> Path:
    """A sequential run of `claims` (servelab.measure.sequential.run_rounds, measuring stubbed), its
    stages' benchmark files, and a profiling pass of a on a launch of its own."""
    stub_measuring(monkeypatch, Clock())
    job = measure_job(experiment(tmp_path, claims), tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    root = job.paths.root
    stages = {
        "model": 0.5,
        "runtime": 1.0,
        "sweep": sum(rec["round_s"]) + LOOKS_S,
        "profile-a": 40.0,
        "analysis": 3.0,
    }
    (root / "benchmarks").mkdir()
    for name, s in stages.items():
        (root / "benchmarks" / f"{name}.tsv").write_text(f"s\th:m:s\n{s}\t0:00:00\n")
    write_json(
        root / "profile" / "a" / "capture.json",
        {"launch": "own", "ready_s": 25.0, "lock": {"path": "/l", "waited_s": 2.0}},
    )
    return root


def breakdown(exp: Path) -> list[str]:
    """The summary's lines from `where the time went` to the server starts' phases."""
    text = render_summary(exp).split("where the time went on this host:\n", 1)[1]
    return text.split("\n\n", 1)[0].splitlines()


def test_the_summary_of_a_sequential_run_says_where_each_round_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run to the plan's maximum: rounds 1-3 on one launch per configuration, then rounds 4
    and 5 on fresh ones. Each step with its launches and their starts, its points and their
    measured time, the rest, and the look after it; the stage's own line sums them, and what
    is left is the looks and the job's own time. Before, the one `sweep` stage read `server
    start ? + 0 points 0.0 s + other 328.5 s`."""
    exp = measured(tmp_path, monkeypatch, [CLEAR, NULL])
    rec = json.loads((exp / "raw" / "a" / "run.json").read_text())["sequential"]
    assert rec["rounds"] == 5 and rec["stopped"] == "maximum"
    # every launch, kept by the sequential record (launch.json keeps the latest alone)
    assert rec["launches"][:2] == [
        {"round": 3, "server_config": "a", "launch": 1, "ready_s": 30.0, "lock_waited_s": 0.0},
        {"round": 3, "server_config": "b", "launch": 1, "ready_s": 31.5, "lock_waited_s": 12.0},
    ]
    assert [(x["round"], x["server_config"], x["launch"]) for x in rec["launches"][2:]] == [
        (4, "a", 2),
        (4, "b", 2),
        (5, "a", 3),
        (5, "b", 3),
    ]
    # rounds 1-3: starts 30 + 31.5, points 3 x (10 + 20) s, 2 x OTHER_S; the step 161.5 s.
    # round 4: 20.5 + 21 + 30 + 10 = 81.5 s; round 5: 19 + 19.5 + 30 + 10 = 78.5 s.
    # the stage: 321.5 + LOOKS_S = 328.5 s; other 328.5 - 141.5 - 150 = 37 s
    assert breakdown(exp) == [
        "  runtime                          1.0 s",
        "  model                            0.5 s",
        "  profile-a                       40.0 s = server start 25.0 s + other 15.0 s",
        "  sweep                          328.5 s = 6 server starts 141.5 s + 20 points 150.0 s "
        "+ other 37.0 s; 5 rounds, stopped: the plan's maximum of rounds",
        "    rounds 1-3                   161.5 s = 2 server starts 61.5 s (a #1 30.0 s, b #1 "
        "31.5 s after 12 s waiting for the measuring-server lock) + 12 points 90.0 s + other "
        "10.0 s; look after round 3: 1 of 2 questions decided, 1 open",
        "    round 4                       81.5 s = 2 server starts 41.5 s (a #2 20.5 s, b #2 "
        "21.0 s) + 4 points 30.0 s + other 10.0 s; look after round 4: 1 of 2 questions "
        "decided, 1 open",
        "    round 5                       78.5 s = 2 server starts 38.5 s (a #3 19.0 s, b #3 "
        "19.5 s) + 4 points 30.0 s + other 10.0 s; look after round 5: 1 of 2 questions "
        "decided, 1 open",
        "    the looks and the rest         7.0 s",
    ]


def test_the_wall_line_of_a_sequential_run_counts_every_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a fixed design: the sweep's server starts (here every launch of every round,
    141.5 s, not the latest of each, 38.5 s), the lock waits of every launch (b's first, 12 s,
    and the profiling pass's 2 s), the profiling pass without its wait."""
    exp = measured(tmp_path, monkeypatch, [CLEAR, NULL])
    # wall 328.5 + 40 + 3 = 371.5 s; windows 150 s; rest 371.5 - 150 - 141.5 - 14 - 38 = 28 s
    assert (
        "wall 372 s for 150 s of measured windows: 2.48x; 2.38x without the 14.0 s spent "
        "waiting for the measuring-server lock (server starts 142 s, profiling pass 38.0 s, "
        "rest 28.0 s); left out: runtime 1.0 s, model 0.5 s (first-run setup: creating the "
        "runtime, fetching the model)"
    ) in render_summary(exp)


def without_launches(exp: Path) -> None:
    """Every run.json as written before the sequential record kept every launch."""
    for sc in ("a", "b"):
        path = exp / "raw" / sc / "run.json"
        doc = json.loads(path.read_text())
        del doc["sequential"]["launches"]
        write_json(path, doc)


def test_raw_data_from_before_the_launches_record_reads_them_from_the_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's run: every question decided at the look after round 3, one launch per
    configuration, measured before the record kept every launch. Its launches are its points'
    `launch`, their starts launch.json's, so the summary and the wall line are as complete."""
    exp = measured(tmp_path, monkeypatch, [CLEAR, SHAPE])
    before = render_summary(exp)
    without_launches(exp)
    assert render_summary(exp) == before
    lines = breakdown(exp)
    assert lines[3:] == [
        "  sweep                          168.5 s = 2 server starts 61.5 s + 12 points 90.0 s "
        "+ other 17.0 s; 3 rounds, stopped: every question decided",
        "    rounds 1-3                   161.5 s = 2 server starts 61.5 s (a #1 30.0 s, b #1 "
        "31.5 s after 12 s waiting for the measuring-server lock) + 12 points 90.0 s + other "
        "10.0 s; look after round 3: 2 of 2 questions decided",
        "    the looks and the rest         7.0 s",
    ]
    # wall 168.5 + 40 + 3 = 211.5 s; windows 90 s; rest 211.5 - 90 - 61.5 - 14 - 38 = 8 s
    assert (
        "wall 212 s for 90.0 s of measured windows: 2.35x; 2.19x without the 14.0 s spent "
        "waiting for the measuring-server lock (server starts 61.5 s, profiling pass 38.0 s, "
        "rest 8.0 s)"
    ) in before


def test_older_raw_data_of_later_rounds_names_the_starts_it_did_not_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured before the record kept every launch, a run past its first look kept the start
    of each configuration's latest launch alone (launch.json): the others are `?`, never
    counted as 0 s of a known start."""
    exp = measured(tmp_path, monkeypatch, [CLEAR, NULL])
    without_launches(exp)
    lines = breakdown(exp)
    assert lines[3].startswith(
        "  sweep                          328.5 s = 6 server starts 38.5 s + ? + 20 points "
    )
    assert lines[4].startswith(
        "    rounds 1-3                   161.5 s = 2 server starts ? (a #1 ?, b #1 ?) + 12 "
        "points 90.0 s + other 71.5 s; "
    )
    assert lines[6].startswith(
        "    round 5                       78.5 s = 2 server starts 38.5 s (a #3 19.0 s, b #3 "
        "19.5 s) + 4 points 30.0 s + other 10.0 s; "
    )


def test_interleaved_rounds_start_a_server_per_configuration_and_round_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sweep.repeats.interleave: every round, the first `min` too, on a fresh launch per
    configuration, a b in odd rounds and b a in even ones; the first step's launches are
    recorded with the round of the look that follows them (3), so the summary's step
    "rounds 1-3" counts all six."""
    order: list[tuple[str, int]] = []
    stub_measuring(monkeypatch, Clock())
    fake = SweepJob.measure_missing

    def spy(job: SweepJob, repeats: int) -> Any:
        order.append((job.sc, repeats))
        return fake(job, repeats)

    monkeypatch.setattr(SweepJob, "measure_missing", spy)
    exp = experiment(tmp_path, [CLEAR, NULL], interleave=True)
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    assert rec["rounds"] == 5 and len(rec["round_s"]) == 3  # steps: rounds 1-3, 4, 5
    assert order == [
        ("a", 1), ("b", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3), ("b", 4), ("a", 4),
        ("a", 5), ("b", 5),
    ]  # fmt: skip
    assert [(x["round"], x["server_config"], x["launch"]) for x in rec["launches"]] == [
        (3, "a", 1), (3, "b", 1), (3, "b", 2), (3, "a", 2), (3, "a", 3), (3, "b", 3),
        (4, "b", 4), (4, "a", 4), (5, "a", 5), (5, "b", 5),
    ]  # fmt: skip
    assert [look["round"] for look in rec["looks"]] == [3, 4, 5]  # no look before `min`
    (job.paths.root / "benchmarks").mkdir()
    sweep_s = sum(rec["round_s"]) + LOOKS_S
    (job.paths.root / "benchmarks" / "sweep.tsv").write_text(f"s\th:m:s\n{sweep_s}\t0:00:00\n")
    (step,) = [ln for ln in breakdown(job.paths.root) if ln.strip().startswith("rounds 1-3")]
    assert "6 server starts" in step
