"""`servelab profile analyze` on generated nsys SQLite exports: known answers for every table.

The scenario (tests/nsys_fixture.py) is worked out by hand there; in short, per forward with
batch b on device 0: layers of 25 + 2b us (23 + 2b busy, a 2 us gap), an all-reduce of 30 us on
another stream from 60 us on. Busy time per forward is 86 us for b = 1 and for b = 2 (the union:
25 + 25 + 36, and 27 + 27 + 32), never the 105 or 111 us sum.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest
from nsys_fixture import (
    C2_START,
    LAYERS,
    SESSION_START,
    NsysFixture,
    model_config,
    scenario,
    scenario_windows,
    windows_file,
)

from servelab.cli import main
from servelab.errors import ServelabError
from servelab.profile.analyze import TraceOptions, analyze_trace
from servelab.profile.windows import load_windows, parse_windows


def run_cli(tmp_path: Path, trace: Path, windows: Path, *extra: str) -> dict:
    out = tmp_path / "out"
    rc = main(
        ["profile", "analyze", str(trace), "--windows", str(windows), "--out", str(out), *extra]
    )
    assert rc == 0
    return json.loads((out / "profile.json").read_text())


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    trace = scenario().write(tmp_path / "trace.sqlite")
    windows = windows_file(tmp_path / "windows.json", scenario_windows())
    cfg = model_config(tmp_path / "config.json", LAYERS)
    return trace, windows, cfg


def test_fixture_follows_the_nsys_schema(files: tuple[Path, Path, Path]) -> None:
    con = sqlite3.connect(files[0])
    cols = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    assert cols[:9] == [
        "start",
        "end",
        "deviceId",
        "contextId",
        "streamId",
        "correlationId",
        "globalPid",
        "demangledName",
        "shortName",
    ]
    assert {"gridX", "gridY", "gridZ", "graphNodeId"} <= set(cols)
    nvtx = [r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")]
    assert nvtx[:3] == ["start", "end", "eventType"] and "jsonText" in nvtx
    graph = con.execute(
        "SELECT COUNT(*), COUNT(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "WHERE graphNodeId IS NOT NULL"
    ).fetchone()
    assert graph == (8 * 12, 8)  # 8 graph-replayed forwards of 12 kernels, one launch each
    assert con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone() == (
        SESSION_START,
    )


def test_known_answers(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    trace, windows, cfg = files
    prof = run_cli(tmp_path, trace, windows, "--model-config", str(cfg))
    c1, c2 = prof["windows"]["c0001"], prof["windows"]["c0002"]

    # windows: c0001 by its wall-clock anchors, c0002 by the client's NVTX ranges (2 requests)
    assert c1["source"] == "wallclock" and c1["length_us"] == 691.0
    assert (c2["source"], c2["requests"]) == ("nvtx", 2)
    assert (c2["start_ns"], c2["length_us"]) == (C2_START - 5_000, 1086.0)

    # active fraction: union over streams; device 1 exists (TARGET_INFO_GPU) and is idle
    assert c1["active_fraction"] == {"0": pytest.approx(4 * 86 / 691), "1": 0.0}
    # the last all-reduce runs 9 us past the NVTX window's end: clipped (86 - 9 = 77)
    assert c2["active_fraction"]["0"] == pytest.approx((5 * 86 + 77) / 1086)

    # families: kernel time per output token, calls and totals
    assert c1["families"] == {
        "communication": {"calls": 4, "total_us": 120.0, "us_per_token": 30.0},
        "attention": {"calls": 12, "total_us": 60.0, "us_per_token": 15.0},
        "gemm": {"calls": 24, "total_us": 216.0, "us_per_token": 54.0},
        "triton": {"calls": 12, "total_us": 24.0, "us_per_token": 6.0},
        "other": {"calls": 0, "total_us": 0.0, "us_per_token": 0.0},
    }
    assert c2["families"]["attention"] == {"calls": 18, "total_us": 114.0, "us_per_token": 11.4}
    assert c2["families"]["gemm"]["total_us"] == 324.0

    # attention paths: the main attention kernel by code path; grid y carries the batch and is
    # masked, so both batch sizes are one path whose launch grows 2 us per sequence
    assert prof["settings"]["attention_kernel"] == ["flash_fwd_kernel"]
    assert prof["settings"]["path_dims"] == ["x", "z"]
    assert prof["settings"]["path_dims_source"] == "found"
    assert c2["attention_paths"] == [
        {
            "path": "2x*x4",
            "grid": [2, None, 4],
            "grids": 2,
            "calls": 18,
            "total_us": 114.0,
            "us_per_token": 11.4,
            "mean_us": pytest.approx(114.0 / 18),
            "slope_us_per_seq": pytest.approx(2.0),
        }
    ]

    # forwards: 3 layers from config.json, population from grid y (found, not given)
    assert prof["settings"]["layers"] == 3 and prof["settings"]["population_dim"] == "y"
    assert c1["forwards"] == {
        "device": "0",
        "count": 4,
        "layers": 3,
        "launches": 12,
        "offset": 0,
        "violations": 0,
        "path_splits": 0,
    }
    assert c2["forwards"]["count"] == 6
    rows = list(csv.DictReader((tmp_path / "out" / "forwards.csv").open()))
    assert [int(r["population"]) for r in rows if r["window"] == "c0002"] == [1, 2, 2, 2, 2, 1]
    assert [float(r["kernel_us"]) for r in rows if r["window"] == "c0002"] == [
        15.0,
        21.0,
        21.0,
        21.0,
        21.0,
        15.0,
    ]

    # steady: after the fill forward, before the drain
    assert c1["steady"] == {
        "first": 0,
        "last": 3,
        "forwards": 4,
        "population_mean": 1.0,
        "kernel_us_mean": 5.0,
        "forward_kernel_us_mean": 15.0,
        "forward_span_us_mean": 59.0,
        "paths": [{"path": "2x*x4", "forwards": 4, "population_mean": 1.0, "kernel_us_mean": 5.0}],
    }
    assert (c2["steady"]["first"], c2["steady"]["last"]) == (1, 4)
    assert c2["steady"]["population_mean"] == 2.0 and c2["steady"]["kernel_us_mean"] == 7.0
    assert prof["ratios"] == [
        {
            "from": "c0001",
            "to": "c0002",
            "population_ratio": 2.0,
            "duration_ratio": 1.4,
            "paths": [{"path": "2x*x4", "population_ratio": 2.0, "duration_ratio": 1.4}],
        }
    ]


def test_epoch_normalized_export_gives_the_same_answers(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    _, windows, cfg = files
    trace_epoch = scenario().write(tmp_path / "epoch.sqlite", ts="epoch")
    a = run_cli(tmp_path / "a", files[0], windows, "--layers", "3")
    b = run_cli(tmp_path / "b", trace_epoch, windows, "--layers", "3")
    assert b["trace"]["clock"] == "epoch" and a["trace"]["clock"] == "trace"
    for key in ("active_fraction", "families", "attention_paths", "steady", "forwards"):
        assert a["windows"]["c0002"][key] == b["windows"]["c0002"][key]
    assert b["windows"]["c0002"]["start_ns"] == SESSION_START + C2_START - 5_000


def test_trace_clock_windows_and_rows_out_of_start_order(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    shuffled = scenario().write(tmp_path / "shuffled.sqlite", shuffle=True)
    tw = windows_file(tmp_path / "tw.json", scenario_windows(ts_epoch=False))
    a = run_cli(tmp_path / "a", files[0], files[1], "--layers", "3")
    b = run_cli(tmp_path / "b", shuffled, tw, "--layers", "3")
    for label in ("c0001", "c0002"):
        assert a["windows"][label]["active_fraction"] == b["windows"][label]["active_fraction"]
        assert a["windows"][label]["steady"] == b["windows"][label]["steady"]


def test_missing_tables(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    _, windows, _ = files
    # no NVTX: c0002 falls back to its wall-clock anchors, 40 us wider on each side
    no_nvtx = scenario().write(tmp_path / "a.sqlite", omit={"NVTX_EVENTS"})
    prof = run_cli(tmp_path / "a", no_nvtx, windows, "--layers", "3")
    c2 = prof["windows"]["c0002"]
    assert c2["source"] == "wallclock" and c2["length_us"] == 1161.0
    assert c2["active_fraction"]["0"] == pytest.approx(6 * 86 / 1161)

    # no kernels at all: the table is absent, every device idle, nothing to group
    empty = scenario()
    empty.kernels.clear()
    prof = run_cli(tmp_path / "b", empty.write(tmp_path / "b.sqlite"), windows, "--layers", "3")
    assert prof["windows"]["c0001"]["active_fraction"] == {"0": 0.0, "1": 0.0}
    assert prof["windows"]["c0001"]["families"]["gemm"]["calls"] == 0
    assert prof["windows"]["c0001"]["steady"] is None
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in prof["trace"]["tables_absent"]
    assert any("no attention kernel" in n for n in prof["notes"])

    # epoch windows cannot be bridged without the session start time
    nostart = scenario().write(tmp_path / "c.sqlite", omit={"TARGET_INFO_SESSION_START_TIME"})
    with pytest.raises(ServelabError, match="TARGET_INFO_SESSION_START_TIME"):
        analyze_trace([nostart], load_windows(windows), TraceOptions(layers=3))


def test_window_cutting_a_forward_is_realigned(tmp_path: Path) -> None:
    fx = scenario()
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    # start 30 us into c0002's first forward: its layers 1 and 2 are inside, layer 0 is not
    w = parse_windows(
        {
            "windows": [
                {
                    "label": "cut",
                    "start_ns": C2_START + 30_000,
                    "end_ns": C2_START + 1_100_000,
                    "clock": "trace",
                    "output_tokens": 9,
                }
            ]
        },
        "test",
    )
    prof = analyze_trace([trace], w, TraceOptions(layers=3)).profile
    f = prof["windows"]["cut"]["forwards"]
    assert (f["offset"], f["count"], f["violations"]) == (2, 5, 0)
    assert prof["windows"]["cut"]["steady"]["population_mean"] == 2.0


def test_inconsistent_forwards_are_reported(tmp_path: Path) -> None:
    fx = NsysFixture()
    # 4 layers, but the second forward's layer 3 runs with another batch size
    for i in range(4):
        for layer in range(4):
            b = 3 if (i == 1 and layer == 3) else 2
            fx.kernel(
                1_000_000 + i * 100_000 + layer * 10_000,
                5_000,
                "paged_attention_v2",
                grid=(8, b, 1),
            )
    trace = fx.write(tmp_path / "t.sqlite")
    w = parse_windows(
        {
            "windows": [
                {
                    "label": "w",
                    "start_ns": 0,
                    "end_ns": 2_000_000,
                    "clock": "trace",
                    "output_tokens": 8,
                }
            ]
        },
        "test",
    )
    prof = analyze_trace([trace], w, TraceOptions(layers=4, population_dim="y")).profile
    assert prof["windows"]["w"]["forwards"]["violations"] == 1
    assert prof["windows"]["w"]["forwards"]["count"] == 4


def test_clear_errors(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    trace, windows, _ = files
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 10)
    with pytest.raises(ServelabError, match="not a torch-profiler trace"):
        analyze_trace([bad], load_windows(windows), TraceOptions())
    wrong = tmp_path / "wrong.json"
    wrong.write_text(
        json.dumps({"windows": [{"label": "a", "start_ns": 5, "end_ns": 1, "clock": "epoch"}]})
    )
    with pytest.raises(ServelabError, match=r"windows\[0\]: start_ns and end_ns"):
        load_windows(wrong)
    clock = tmp_path / "clock.json"
    clock.write_text(
        json.dumps({"windows": [{"label": "a", "start_ns": 1, "end_ns": 5, "clock": "gpu"}]})
    )
    with pytest.raises(ServelabError, match="clock: 'gpu' is not one of trace, epoch"):
        load_windows(clock)
    assert (
        main(
            [
                "profile",
                "analyze",
                str(trace),
                "--windows",
                str(tmp_path / "none.json"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    nolayers = model_config(tmp_path / "c.json", 3)
    nolayers.write_text(json.dumps({"hidden_size": 8}))
    assert (
        main(
            [
                "profile",
                "analyze",
                str(trace),
                "--windows",
                str(windows),
                "--out",
                str(tmp_path / "o"),
                "--model-config",
                str(nolayers),
            ]
        )
        == 2
    )


def test_outputs_are_deterministic(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    trace, windows, cfg = files
    for sub in ("a", "b"):
        main(
            [
                "profile",
                "analyze",
                str(trace),
                "--windows",
                str(windows),
                "--model-config",
                str(cfg),
                "--out",
                str(tmp_path / sub),
            ]
        )
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "profile.json" in names and "families.csv" in names and "profile.md" in names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    fam = (tmp_path / "a" / "families.csv").read_text().splitlines()
    assert fam[0] == "window,family,calls,total_us,us_per_token"
    assert fam[1].startswith("c0001,attention,12,60,15")


def test_rows_found_out_of_order_mid_pass_are_merged_again(
    tmp_path: Path, files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from servelab.profile.nsys import NsysTrace

    # the sample probe is fooled: the single pass itself must notice and redo the merge sorted
    monkeypatch.setattr(NsysTrace, "_looks_ordered", lambda self, con, sample=0: True)
    shuffled = scenario().write(tmp_path / "shuffled.sqlite", shuffle=True)
    t = NsysTrace(shuffled)
    wins = t.resolve(load_windows(files[1]))
    busy = t.busy(wins)
    assert t.ordered is False
    assert busy[1]["0"] == 5 * 86_000 + 77_000
    ordered = NsysTrace(files[0])
    ordered.busy(ordered.resolve(load_windows(files[1])))
    assert ordered.ordered is True


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


@pytest.mark.parametrize("shuffle", [False, True])
def test_busy_and_totals_match_a_brute_force_over_many_windows(
    tmp_path: Path, shuffle: bool
) -> None:
    """Seven windows (given out of order, with gaps), three devices, kernels that straddle
    window edges and overlap across streams: the SQL passes (window found by a binary search,
    integer keys) against the definitions computed row by row in Python."""
    import random

    from servelab.profile.nsys import NsysTrace

    rnd = random.Random(7)
    fx = NsysFixture(gpus=((0, "a"), (1, "b"), (2, "c")))
    for _ in range(3000):
        fx.kernel(
            rnd.randrange(0, 1_000_000),
            rnd.choice([5, 50, 500, 5_000, 40_000]),
            rnd.choice(["gemm_a", "flash_fwd_kernel", "rms_norm", "nccl_allreduce"]),
            device=rnd.randrange(3),
            stream=rnd.choice([7, 13]),
            grid=(1, rnd.randrange(1, 4), 8),
        )
    bounds = [(10_000, 90_000), (90_000, 200_000), (250_000, 251_000), (300_000, 480_000),
              (480_000, 700_000), (800_000, 850_000), (900_000, 990_000)]  # fmt: skip
    order = [3, 0, 6, 2, 5, 1, 4]
    spec = [
        {"label": f"w{i}", "start_ns": bounds[i][0], "end_ns": bounds[i][1], "clock": "trace"}
        for i in order
    ]
    trace = NsysTrace(fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"}, shuffle=shuffle))
    wins = trace.resolve(parse_windows({"windows": spec}, "test"))
    busy, stats = trace.busy(wins), trace.stats(wins)
    for i, w in enumerate(wins):
        lo, hi = w.lo, w.hi
        mine = [k for k in fx.kernels if lo <= k.start < hi]
        want: dict[str, list[int]] = {}
        for k in mine:
            acc = want.setdefault(k.name, [0, 0])
            acc[0] += 1
            acc[1] += k.end - k.start
        got = {s.name: [s.calls, s.total_ns] for s in stats[i]}
        assert got == want, w.label
        for dev in range(3):
            # a kernel's busy time goes to the first window it overlaps, clipped to it
            first = [
                k for k in fx.kernels
                if k.device == dev and k.start < hi and k.end > lo
                and not any(v.lo < lo and k.start < v.hi and k.end > v.lo for v in wins)
            ]  # fmt: skip
            expect = _union([(max(k.start, lo), min(k.end, hi)) for k in first])
            assert busy[i].get(str(dev), 0) == expect, (w.label, dev)
    assert trace.ordered is not shuffle
    # the main kernel's launches, read in chunks that mix windows and devices: time per grid
    main = {"void flash_fwd_kernel<(int)128, true>(Params)"}
    mp = trace.main_pass(wins, main, {}, 2, [1])
    for i, w in enumerate(wins):
        want_grid: dict[tuple[int, int, int], list[int]] = {}
        for k in fx.kernels:
            if k.name == "flash_fwd_kernel" and w.lo <= k.start < w.hi:
                acc = want_grid.setdefault(k.grid, [0, 0])
                acc[0] += 1
                acc[1] += k.end - k.start
        assert {s.grid: [s.calls, s.total_ns] for s in mp.stats[i]} == want_grid
        for dev in range(3):
            n = sum(
                1
                for k in fx.kernels
                if k.name == "flash_fwd_kernel" and k.device == dev and w.lo <= k.start < w.hi
            )
            g = mp.groupers[1].get((i, str(dev)))
            assert (g.launches if g else 0) == n
    assert mp.distinct == [{1}, {1, 2, 3}, {8}]
    # one window: a chunk then holds one window but several devices
    big = max(wins, key=lambda w: w.hi - w.lo)
    one = trace.main_pass([big], main, {}, 2, [1])
    for dev in range(3):
        n = sum(
            1
            for k in fx.kernels
            if k.name == "flash_fwd_kernel" and k.device == dev and big.lo <= k.start < big.hi
        )
        assert n and one.groupers[1][(0, str(dev))].launches == n


def test_no_varying_grid_dimension_leaves_populations_unknown(tmp_path: Path) -> None:
    """Every launch with the same grid: forwards are grouped, their populations unknown, and
    the notes say why (a short trace: the grouping settles only at the end)."""
    fx = NsysFixture()
    for i in range(5):
        for layer in range(3):
            fx.kernel(1_000_000 + i * 100_000 + layer * 10_000, 5_000, "flash_fwd_kernel",
                      grid=(4, 2, 8))  # fmt: skip
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace"}]},
        "test",
    )
    res = analyze_trace([trace], w, TraceOptions(layers=3))
    assert res.profile["settings"]["population_dim"] is None
    assert any("no grid dimension" in n for n in res.profile["notes"])
    fw = res.forwards["w"]
    assert len(fw) == 5 and all(f.population is None and f.consistent for _, f in fw)
    assert res.profile["windows"]["w"]["steady"] is None
