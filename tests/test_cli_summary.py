from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.cli import main
from servelab.store.rawdata import load_points
from servelab.summary import render_summary, summary_rows


def make_point(
    exp: Path,
    sc: str,
    rep: int,
    conc: int,
    tput: float,
    ttft: float,
    status: str = "complete",
    suffix: str = "",
) -> None:
    d = exp / "raw" / sc / f"rep{rep:02d}" / f"c{conc:04d}{suffix}"
    d.mkdir(parents=True)
    (d / "point.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "status": status,
                "server_config": sc,
                "repeat": rep,
                "concurrency": conc,
                "output_throughput": tput,
                "mean_ttft_ms": ttft,
                "failed": 0,
            }
        )
    )


def test_summary_means_over_repeats_and_skips_incomplete(tmp_path: Path) -> None:
    for rep, t in [(1, 100.0), (2, 110.0), (3, 90.0)]:
        make_point(tmp_path, "a", rep, 1, t, 10.0 * rep)
        make_point(tmp_path, "a", rep, 4, t * 1.02, 40.0)
    make_point(tmp_path, "a", 1, 8, 1e9, 1.0, status="incomplete", suffix=".incomplete")
    rows = summary_rows([p.meta for p in load_points(tmp_path)])
    assert [(r["concurrency"], r["repeats"]) for r in rows] == [(1, 3), (4, 3)]
    assert rows[0]["output_throughput"] == pytest.approx(100.0)
    assert rows[0]["mean_ttft_ms"] == pytest.approx(20.0)
    assert (rows[0]["output_throughput_min"], rows[0]["output_throughput_max"]) == (90.0, 110.0)
    text = render_summary(tmp_path)
    assert "a: best/worst mean throughput across concurrency = 1.02x" in text
    assert "1000000000" not in text


def test_unknown_point_format_is_refused(tmp_path: Path) -> None:
    make_point(tmp_path, "a", 1, 1, 1.0, 1.0)
    p = tmp_path / "raw" / "a" / "rep01" / "c0001" / "point.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "format_version": 99}))
    with pytest.raises(Exception, match="format_version 99"):
        render_summary(tmp_path)


def test_cli_check_config(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(repo / "config" / "config.yaml")]) == 0
    assert "valid; experiment quickstart-cpu" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: x\nsweep: {concurrency: []}\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0]


def test_cli_lock_round_trip(tmp_path: Path) -> None:
    report = {
        "install": [
            {
                "metadata": {"name": "a", "version": "1"},
                "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}},
            }
        ]
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    out = tmp_path / "x.lock"
    assert (
        main(["lock", "--report", str(tmp_path / "r.json"), "--out", str(out), "--title", "t"]) == 0
    )
    from servelab.env.runtime import parse_lock

    assert parse_lock(out.read_text()) == {"a": "1"}


def test_summary_says_where_the_time_went(tmp_path: Path) -> None:
    """Server starts, measured points and the rest, per sweep and profiling pass, from the
    jobs' benchmark files, launch.json / capture.json and the points' durations."""
    for rep, dur in [(1, 10.0), (2, 12.5)]:
        make_point(tmp_path, "a", rep, 1, 100.0, 10.0)
        p = tmp_path / "raw" / "a" / f"rep{rep:02d}" / "c0001" / "point.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "duration": dur}))
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name, s in [
        ("runtime", 2.0),
        ("model", 3.5),
        ("sweep-a", 130.0),
        ("profile-a", 95.0),
        ("profile-report-a", 1.5),
    ]:
        (bench / f"{name}.tsv").write_text(f"s\th:m:s\n{s}\t0:00:00\n")
    (tmp_path / "server" / "a").mkdir(parents=True)
    (tmp_path / "server" / "a" / "launch.json").write_text(json.dumps({"ready_s": 80.25}))
    (tmp_path / "profile" / "a").mkdir(parents=True)
    (tmp_path / "profile" / "a" / "capture.json").write_text(json.dumps({"ready_s": 70.0}))
    text = render_summary(tmp_path)
    assert "where the time went on this host:" in text
    assert (
        "sweep-a                        130.0 s = server start 80.2 s + 2 points 22.5 s + other 27.2 s"
        in text
    )
    assert "profile-a                       95.0 s = server start 70.0 s + other 25.0 s" in text
    assert "runtime                          2.0 s" in text
    assert "profile-report-a " not in text.split("where the time went", 1)[1]


def test_summary_shows_each_start_and_the_wall_time_against_the_windows(tmp_path: Path) -> None:
    """Per launch, its start's phases (launch.json / capture.json `start`); then the wall time
    (the stages, first-run setup left out) against the sum of the measured windows."""
    from servelab.launch.serverlog import start_phases

    for rep, dur in [(1, 10.0), (2, 14.0)]:
        make_point(tmp_path, "a", rep, 1, 100.0, 10.0)
        p = tmp_path / "raw" / "a" / f"rep{rep:02d}" / "c0001" / "point.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "duration": dur}))
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name, s in [
        ("runtime", 300.0),
        ("model", 3.5),
        ("sweep-a", 130.0),
        ("profile-a", 95.0),
        ("profile-report-a", 1.0),
        ("analysis", 4.0),
    ]:
        (bench / f"{name}.tsv").write_text(f"s\th:m:s\n{s}\t0:00:00\n")
    log = [
        (7.0, "(APIServer pid=1) INFO 12-02 07:52:14 [api_utils.py:347] version 0.32.0"),
        (14.2, "(APIServer pid=1) INFO 12-02 07:52:21 [model.py:733] Resolved architecture: Q"),
        (
            30.0,
            "(Worker pid=3) INFO 12-02 07:52:35 [cpu_model_runner.py:87] Warming up model for the compilation...",
        ),
        (
            52.0,
            "(Worker pid=3) INFO 12-02 07:52:57 [decorators.py:743] [backbone] saved AOT compiled function to /c",
        ),
        (52.0, "(Worker pid=3) INFO 12-02 07:52:58 [cpu_model_runner.py:91] Warming up done."),
    ]
    (tmp_path / "server" / "a").mkdir(parents=True)
    (tmp_path / "server" / "a" / "launch.json").write_text(
        json.dumps(
            {
                "ready_s": 80.0,
                "start": start_phases(log, 80.0),
                "lock": {"path": "/l", "waited_s": 12.4, "holder": {"pid": 9}},
            }
        )
    )
    (tmp_path / "profile" / "a").mkdir(parents=True)
    (tmp_path / "profile" / "a" / "capture.json").write_text(
        json.dumps(
            {
                "ready_s": 70.0,
                "start": start_phases(log[:2], 70.0),
                "lock": {"path": "/l", "waited_s": 5.0, "holder": {"pid": 9}},
            }
        )
    )
    text = render_summary(tmp_path)
    assert "server starts (latest launch of each), seconds per phase:" in text
    assert (
        "  sweep-a                      start 80.0 s: import 7.0, config 7.2, engine 15.8, "
        "compile 22.0 (cache miss), kv 28.0 (after 12 s waiting for the measuring-server lock)"
    ) in text
    assert (
        "  profile-a                    start 70.0 s: import 7.0, config 7.2, engine 55.8 "
        "(after 5 s waiting for the measuring-server lock)\n" in text
    )
    # wall: 130 + 95 + 1 + 4 = 230 s; windows 24 s; starts 80 s; lock waits 12.4 + 5 s, the
    # profiling pass's own left out of it: 95 - 5 + 1 = 91 s; rest 17.6 s; 212.6 / 24 = 8.86x
    assert (
        "wall 230 s for 24.0 s of measured windows: 9.58x; 8.86x without the 17.4 s spent "
        "waiting for the measuring-server lock (server starts 80.0 s, profiling pass 91.0 s, "
        "rest 17.6 s); left out: runtime 300 s, model 3.5 s "
        "(first-run setup: creating the runtime, fetching the model)"
    ) in text


def test_no_wall_line_without_stage_times_or_windows(tmp_path: Path) -> None:
    make_point(tmp_path, "a", 1, 1, 100.0, 10.0)
    assert "wall " not in render_summary(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "sweep-a.tsv").write_text("s\th:m:s\n5.0\t0:00:05\n")
    assert "wall 5.0 s for 0.0 s of measured windows: no measured window" in render_summary(
        tmp_path
    )
