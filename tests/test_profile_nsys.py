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

import jsonschema
import pytest
from nsys_fixture import (
    C2_START,
    LAYERS,
    SESSION_START,
    NsysFixture,
    gpu_uuid,
    model_config,
    scenario,
    scenario_windows,
    windows_file,
)

from servelab.cli import main
from servelab.errors import ServelabError
from servelab.profile.trace_analysis import TraceOptions, analyze_trace
from servelab.profile.windows import load_windows, parse_windows

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "src/servelab/schemas/profile.schema.json").read_text()
)


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

    # active fraction: union over streams, on GPU 3 (the process's CUDA device 0); the other
    # 7 GPUs of the host (TARGET_INFO_GPU) ran nothing and are listed as idle, not averaged in
    assert c1["active_fraction"] == {"3": pytest.approx(4 * 86 / 691)}
    assert c1["idle_gpus"] == ["0", "1", "2", "4", "5", "6", "7"]
    # the last all-reduce runs 9 us past the NVTX window's end: clipped (86 - 9 = 77)
    assert c2["active_fraction"]["3"] == pytest.approx((5 * 86 + 77) / 1086)

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
            "instantiations": ["#1"],
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
        "device": "3",
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
        "paths": [
            {
                "path": "2x*x4",
                "forwards": 4,
                "first": 0,
                "last": 3,
                "population_mean": 1.0,
                "kernel_us_mean": 5.0,
                "below_minimum": True,  # 4 forwards, fewer than MIN_STEADY_FORWARDS
            }
        ],
    }
    assert (c2["steady"]["first"], c2["steady"]["last"]) == (1, 4)
    assert c2["steady"]["population_mean"] == 2.0 and c2["steady"]["kernel_us_mean"] == 7.0
    assert prof["ratios"] == [
        {
            "from": "c0001",
            "to": "c0002",
            "population_ratio": 2.0,
            "duration_ratio": 1.4,
            "paths": [
                {
                    "path": "2x*x4",
                    "population_ratio": 2.0,
                    "duration_ratio": 1.4,
                    "below_minimum": True,
                }
            ],
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
    assert c2["active_fraction"]["3"] == pytest.approx(6 * 86 / 1161)

    # no kernels at all: the table is absent, every device idle, nothing to group
    empty = scenario()
    empty.kernels.clear()
    prof = run_cli(tmp_path / "b", empty.write(tmp_path / "b.sqlite"), windows, "--layers", "3")
    assert prof["windows"]["c0001"]["active_fraction"] == {}  # every GPU idle
    assert len(prof["windows"]["c0001"]["idle_gpus"]) == 8
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
    assert busy[1]["3"] == 5 * 86_000 + 77_000
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

    from servelab.profile.nsys import MainQuery, NsysTrace

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
    mp = trace.main_pass(wins, MainQuery(main, {}, 2, [1]))
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
    one = trace.main_pass([big], MainQuery(main, {}, 2, [1]))
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


# --- GPU ids: TARGET_INFO_CUDA_DEVICE ------------------------------------------------------


def test_gpu_ids_through_target_info_cuda_device(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    """The kernel table's deviceId is the process's CUDA device; TARGET_INFO_GPU lists every
    GPU of the host. The scenario serves on GPU 3 (CUDA device 0 of its process): the profile
    reports GPU 3 and leaves the 7 idle GPUs out of the active fraction."""
    trace, windows, cfg = files
    con = sqlite3.connect(trace)
    assert con.execute("SELECT COUNT(*) FROM TARGET_INFO_GPU").fetchone() == (8,)
    assert con.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall() == [
        (0,)
    ]
    prof = run_cli(tmp_path, trace, windows, "--model-config", str(cfg))
    assert prof["trace"]["device_map"] == {
        "source": "TARGET_INFO_CUDA_DEVICE",
        "cuda_devices": [
            {"pid": 4242, "cuda_id": 0, "gpu_id": 3, "uuid": gpu_uuid(3), "by": "uuid"}
        ],
    }
    assert len(prof["trace"]["devices"]) == 8
    for w in prof["windows"].values():
        assert list(w["active_fraction"]) == ["3"] and w["forwards"]["device"] == "3"
    rows = list(csv.DictReader((tmp_path / "out" / "active_fraction.csv").open()))
    assert {r["device"] for r in rows} == {"3"}
    assert not any("TARGET_INFO_CUDA_DEVICE" in n for n in prof["notes"])

    # the table's gpuId disagrees with its UUID: the UUID names the GPU
    con = sqlite3.connect(trace)
    con.execute("UPDATE TARGET_INFO_CUDA_DEVICE SET gpuId = 5")
    con.commit()
    con.close()
    prof = run_cli(tmp_path / "by-uuid", trace, windows, "--layers", "3")
    assert list(prof["windows"]["c0001"]["active_fraction"]) == ["3"]

    # an older export without the table: deviceId is taken as the GPU id, and a note says so
    old = scenario().write(tmp_path / "old.sqlite", omit={"TARGET_INFO_CUDA_DEVICE"})
    prof = run_cli(tmp_path / "old", old, windows, "--layers", "3")
    assert prof["trace"]["device_map"] == {"source": "deviceId", "cuda_devices": []}
    assert list(prof["windows"]["c0001"]["active_fraction"]) == ["0"]
    assert any("no TARGET_INFO_CUDA_DEVICE table" in n for n in prof["notes"])


def test_gpu_ids_per_process(tmp_path: Path) -> None:
    """Two worker processes that each see their GPU as CUDA device 0 (one CUDA_VISIBLE_DEVICES
    per worker): the mapping is per process, so their kernels land on GPUs 2 and 5, each with
    its own busy time and forwards, never merged into one device 0."""
    fx = NsysFixture(
        gpus=tuple((i, "NVIDIA H100 80GB HBM3") for i in range(8)),
        cuda_devices=((2, 0, 100), (5, 0, 200)),
    )
    for i in range(4):
        for pid, dur in ((100, 5_000), (200, 9_000)):
            for layer in range(2):
                fx.kernel(1_000_000 + i * 100_000 + layer * 20_000, dur, "flash_fwd_kernel",
                          grid=(1, 1 + i % 2, 8), pid=pid)  # fmt: skip
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace"}]},
        "test",
    )
    res = analyze_trace([trace], w, TraceOptions(layers=2))
    win = res.profile["windows"]["w"]
    assert win["active_fraction"] == {
        "2": pytest.approx(8 * 5_000 / 2_000_000),
        "5": pytest.approx(8 * 9_000 / 2_000_000),
    }
    assert win["idle_gpus"] == ["0", "1", "3", "4", "6", "7"]
    assert sorted({d for d, _ in res.forwards["w"]}) == ["2", "5"]
    assert win["forwards"] == {
        "device": "2",
        "count": 4,
        "layers": 2,
        "launches": 8,
        "offset": 0,
        "violations": 0,
        "path_splits": 0,
    }


# --- vLLM's step ranges (NVTX) against the forwards ----------------------------------------


def test_vllm_step_ranges_checked_against_forwards(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    """vLLM's worker names each step `execute_context_N(T)_generation_M(T2)` in an NVTX
    push/pop range on its thread; each forward's first launch is traced to the host call that
    made it (CUPTI_ACTIVITY_KIND_RUNTIME, same correlationId) and so to its step."""
    trace, windows, cfg = files
    con = sqlite3.connect(trace)
    assert con.execute(
        "SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59 AND text LIKE 'execute_context_%'"
    ).fetchone() == (10,)
    prof = run_cli(tmp_path, trace, windows, "--model-config", str(cfg))
    jsonschema.validate(prof, SCHEMA)
    assert prof["trace"]["nvtx"] == {
        "client_ranges": {"c0002": 2},
        "step_ranges": 10,
        "step_formats": ["context/generation"],
        "steps_projected": True,
    }
    c1, c2 = prof["windows"]["c0001"]["steps"], prof["windows"]["c0002"]["steps"]
    assert c1 == {
        "format": "context/generation",
        "ranges": 4,
        "forwards": 4,
        "projected": True,
        "matched": 4,
        "steps": 4,
        "shared": 0,
        "missed": 0,
        "agree": True,
        "kinds": {"decode": 3, "prefill": 1},
        "population": {"equal": 4, "above": 0, "below": 0},
        "paths": {"2x*x4": {"decode": 3, "prefill": 1}},
    }
    assert (c2["matched"], c2["agree"]) == (6, True)
    assert c2["kinds"] == {"decode": 4, "mixed": 1, "prefill": 1}
    rows = list(csv.DictReader((tmp_path / "out" / "forwards.csv").open()))
    c2_rows = [r for r in rows if r["window"] == "c0002"]
    assert [(r["step_context"], r["step_generation"]) for r in c2_rows] == [
        ("1", "0"),
        ("1", "1"),
        ("0", "2"),
        ("0", "2"),
        ("0", "2"),
        ("0", "1"),
    ]
    assert c2_rows[0]["step_context_tokens"] == "32"
    steps = (tmp_path / "out" / "steps.csv").read_text().splitlines()
    assert steps[1] == "c0001,context/generation,4,4,4,4,0,0,true,4,0,0"
    assert (
        "vLLM's step ranges (NVTX) against the forwards"
        in (tmp_path / "out" / "profile.md").read_text()
    )


def test_vllm_steps_that_disagree_with_the_forwards(tmp_path: Path) -> None:
    """A step whose forward is not in the kernels, and a step whose requests differ from the
    grid's population (CUDA-graph padding shows as 'above'), are counted, not hidden."""
    from nsys_fixture import C1_START, FORWARD_PERIOD, step_name, step_range

    fx = scenario()
    # a step between c0001's forwards 1 and 2 that launched nothing the trace holds
    t = C1_START + FORWARD_PERIOD + 120_000
    fx.ranges.append(step_range(t, t + 30_000, step_name(0, 0, 1)))
    # c0001's forward 3 runs with grid population 1, its step schedules no request at all
    last = next(r for r in fx.ranges if r.start == C1_START + 3 * FORWARD_PERIOD - 20_000)
    last.message = step_name(0, 0, 0)
    # c0001's forward 2: a padded batch (grid 1 sequence, but the step says 2 requests)
    mid = next(r for r in fx.ranges if r.start == C1_START + 2 * FORWARD_PERIOD - 20_000)
    mid.message = step_name(0, 0, 2)
    trace = fx.write(tmp_path / "t.sqlite")
    windows = windows_file(tmp_path / "w.json", scenario_windows())
    prof = analyze_trace([trace], load_windows(windows), TraceOptions(layers=3)).profile
    st = prof["windows"]["c0001"]["steps"]
    assert (st["matched"], st["missed"], st["agree"]) == (4, 1, False)
    assert st["population"] == {"equal": 2, "above": 1, "below": 1}
    assert st["kinds"] == {"decode": 2, "empty": 1, "prefill": 1}

    # without the runtime table a step cannot be traced to its forwards: said, not guessed
    bare = fx.write(tmp_path / "bare.sqlite", omit={"CUPTI_ACTIVITY_KIND_RUNTIME"})
    prof = analyze_trace([bare], load_windows(windows), TraceOptions(layers=3)).profile
    st = prof["windows"]["c0001"]["steps"]
    # 4 step ranges with requests overlap c0001: 3 of its forwards' (the 4th schedules none)
    # and the extra one
    assert (st["projected"], st["matched"], st["agree"], st["ranges"]) == (False, None, None, 4)
    assert prof["trace"]["nvtx"]["steps_projected"] is False
    assert any("CUPTI_ACTIVITY_KIND_RUNTIME" in n for n in prof["notes"])


def test_what_the_trace_holds_of_the_client_nvtx(tmp_path: Path) -> None:
    """The client's NVTX ranges are emitted on the host, outside the server's nsys session:
    the analysis records what the trace holds, and says why windows then come from wall-clock
    anchors (windows.json's `client_nvtx_emitted` only says the client emitted them)."""
    fx = scenario()
    fx.ranges = [r for r in fx.ranges if r.domain != "servelab"]
    trace = fx.write(tmp_path / "t.sqlite")
    rows = scenario_windows()
    windows = tmp_path / "w.json"
    windows.write_text(
        json.dumps({"format_version": 1, "client_nvtx_emitted": True, "windows": rows})
    )
    prof = analyze_trace([trace], load_windows(windows), TraceOptions(layers=3)).profile
    assert prof["trace"]["nvtx"]["client_ranges"] == {}
    assert {w["source"] for w in prof["windows"].values()} == {"wallclock"}
    assert any("holds no NVTX range of the client" in n for n in prof["notes"])


# --- kernel families: the instantiations of the main attention kernel ----------------------


def test_instantiations_that_share_a_grid_path_are_split(tmp_path: Path) -> None:
    """FlashAttention-2's decode forwards run two instantiations (Is_even_MN following the
    shapes) with the same grid path: the main attention kernel is their family (one short
    name), every forward is kept, and the grid path is split by instantiation."""
    from nsys_fixture import fa2_splitkv

    fx = NsysFixture()
    pops = [2, 4, 4, 4, 4, 4, 4, 4]
    for i, b in enumerate(pops):
        for layer in range(3):
            fx.kernel(1_000_000 + i * 100_000 + layer * 20_000, 4_000 + (1_000 if i % 2 else 0),
                      "flash_fwd_splitkv_kernel", grid=(1, b, 8),
                      demangled=fa2_splitkv(causal=False, even_mn=i % 2 == 0))  # fmt: skip
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace",
                      "output_tokens": 30}]},
        "test",
    )  # fmt: skip
    res = analyze_trace([trace], w, TraceOptions(layers=3))
    prof = res.profile
    assert prof["settings"]["attention_kernel"] == ["flash_fwd_splitkv_kernel"]
    assert prof["settings"]["attention_family"] == "flash_fwd_splitkv_kernel"
    inst = prof["settings"]["attention_instantiations"]
    assert [(i["label"], i["calls"]) for i in inst] == [("#1", 12), ("#2", 12)]
    # Is_even_MN (the 4th flag) true: the cheaper instantiation, #2
    assert "<128, 64, 128, 4, cutlass::bfloat16_t>>, false, false, false, true," in inst[1]["name"]
    win = prof["windows"]["w"]
    assert win["forwards"]["count"] == 8 and win["forwards"]["violations"] == 0
    paths = {p["path"]: p for p in win["attention_paths"]}
    assert {k: (p["calls"], p["instantiations"]) for k, p in paths.items()} == {
        "1x*x8#1": (12, ["#1"]),
        "1x*x8#2": (12, ["#2"]),
    }
    assert [res.split.of_key(f.key) for _, f in res.forwards["w"]] == ["1x*x8#2", "1x*x8#1"] * 4


# --- each attention path its own steady state ----------------------------------------------


def low_concurrency(fx: NsysFixture, t0: int = 1_000_000) -> list[tuple[str, int, int]]:
    """Concurrency 4 on a 3-layer model: 4 forwards that admit a request each (mixed, gridX
    9), then 6 cycles of 5 decode forwards (gridX 1) at 4 sequences, a request finishing
    (3 sequences), and a mixed forward admitting the next (4 sequences); a drain. The
    population dips every 7 forwards, so any run of consecutive forwards on the plateau
    holds one mixed forward. Returns (path, population, per-launch ns) per forward."""
    plan: list[tuple[int, int, int]] = [(9, b, 20_000 + 1_000 * b) for b in (1, 2, 3, 4)]
    for c in range(6):
        plan += [(1, 4, 6_000)] * 5 + [(1, 3, 5_500)]
        plan.append((9, 4, 30_000 + 2_000 * c))  # prompts of different lengths
    plan += [(1, 3, 5_500), (1, 2, 5_000), (1, 1, 4_500)]
    out = []
    for i, (x, b, ns) in enumerate(plan):
        t = t0 + i * 200_000
        for layer in range(3):
            fx.kernel(t + layer * 50_000, ns, "flash_fwd_splitkv_kernel", grid=(x, b, 8))
        out.append((f"{x}x*x8", b, ns))
    return out


def test_each_path_has_its_own_steady_state(tmp_path: Path) -> None:
    fx = NsysFixture()
    plan = low_concurrency(fx)
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 20_000_000, "clock": "trace",
                      "output_tokens": 200}]},
        "test",
    )  # fmt: skip
    prof = analyze_trace([trace], w, TraceOptions(layers=3)).profile
    steady = prof["windows"]["w"]["steady"]
    assert steady["forwards"] == 6  # the run of consecutive forwards: one mixed forward in it
    sp = {p["path"]: p for p in steady["paths"]}
    # the mixed path rests on its own forwards on the plateau: the 4th admission and the 6
    # after the dips, not on the single one inside the run of consecutive forwards
    mixed = [(i, ns) for i, (p, b, ns) in enumerate(plan) if p == "9x*x8" and b == 4]
    assert sp["9x*x8"]["forwards"] == 7
    assert (sp["9x*x8"]["first"], sp["9x*x8"]["last"]) == (mixed[0][0], mixed[-1][0])
    assert sp["9x*x8"]["kernel_us_mean"] == pytest.approx(sum(ns for _, ns in mixed) / 7 / 1000)
    assert sp["9x*x8"]["population_mean"] == 4.0 and sp["9x*x8"]["below_minimum"] is False
    # the decode path dips too (a request finishing): its own run is one cycle's 5 forwards
    assert (sp["1x*x8"]["forwards"], sp["1x*x8"]["below_minimum"]) == (5, False)


def test_a_path_below_the_minimum_is_marked(tmp_path: Path) -> None:
    from servelab.profile.codepaths import MIN_STEADY_FORWARDS

    fx = NsysFixture()
    for i in range(MIN_STEADY_FORWARDS - 1):
        fx.kernel(1_000_000 + i * 100_000, 5_000, "flash_fwd_kernel", grid=(1, 2 + i % 2, 8))
    trace = fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace"}]},
        "test",
    )
    out = tmp_path / "out"
    res = analyze_trace([trace], w, TraceOptions(layers=1, band=0.6))
    from servelab.profile.report import write_profile

    write_profile(out, res.profile, res)
    (p,) = res.profile["windows"]["w"]["steady"]["paths"]
    assert (p["forwards"], p["below_minimum"]) == (MIN_STEADY_FORWARDS - 1, True)
    assert "| w | 1x*x8 | 4 |" in (out / "profile.md").read_text()
    assert f"{MIN_STEADY_FORWARDS - 1} (below minimum)" in (out / "profile.md").read_text()


# --- GPUs matched to the telemetry's by UUID -----------------------------------------------


def container_trace(tmp_path: Path, uuid: str | None) -> Path:
    """A server in a container given the host's GPU 3 alone: nsys lists it with id 0, under
    `uuid` (the host GPU's, or None: an export without it)."""
    from nsys_fixture import container_gpu

    fx = container_gpu(3)
    fx.uuids[0] = uuid
    for i in range(4):
        for layer in range(2):
            fx.kernel(1_000_000 + i * 100_000 + layer * 20_000, 5_000, "flash_fwd_kernel",
                      grid=(1, 1 + i % 2, 8))  # fmt: skip
    return fx.write(tmp_path / "t.sqlite", omit={"NVTX_EVENTS"})


def test_a_container_gpu_is_matched_to_the_telemetry_by_uuid(tmp_path: Path) -> None:
    """Inside a container given one GPU, nsys lists that GPU with id 0 whichever GPU of the
    host it is: the trace's GPU is matched to the telemetry's by UUID (GPU 3 of the host,
    NVML index 3), never taken for the host's GPU 0."""
    from servelab.profile.gpumatch import TelemetryGpu

    trace = container_trace(tmp_path, gpu_uuid(3))
    con = sqlite3.connect(trace)
    assert con.execute("SELECT id, uuid FROM TARGET_INFO_GPU").fetchall() == [(0, gpu_uuid(3))]
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace"}]},
        "test",
    )
    # the telemetry sampled host GPUs 0 and 3 (NVML indices), named by their UUIDs (upper
    # case, without the GPU- prefix for GPU 3: compared as the same UUID)
    sampled = (
        TelemetryGpu(0, gpu_uuid(0), "NVIDIA H100 80GB HBM3"),
        TelemetryGpu(3, gpu_uuid(3)[4:].upper(), "NVIDIA H100 80GB HBM3"),
    )
    res = analyze_trace([trace], w, TraceOptions(layers=2, telemetry_gpus=sampled))
    prof = res.profile
    jsonschema.validate(prof, SCHEMA)
    assert prof["trace"]["gpus"] == [
        {
            "id": "0",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": gpu_uuid(3),
            "telemetry_device": 3,
            "matched_by": "uuid",
        }
    ]
    assert not any("trace GPU" in n for n in prof["notes"])
    from servelab.profile.report import write_profile

    write_profile(tmp_path / "out", prof, res)
    assert (
        f"GPUs that ran kernels (the trace's ids): 0 = {gpu_uuid(3)}, the telemetry's GPU 3 "
        "(by uuid)." in (tmp_path / "out" / "profile.md").read_text()
    )

    # the telemetry sampled other GPUs (another node): not matched, and said
    other = (TelemetryGpu(1, gpu_uuid(1)),)
    prof = analyze_trace([trace], w, TraceOptions(layers=2, telemetry_gpus=other)).profile
    assert prof["trace"]["gpus"][0]["telemetry_device"] is None
    assert any(f"trace GPU 0 ({gpu_uuid(3)}) is none of the GPUs" in n for n in prof["notes"])


def test_a_gpu_without_uuid_falls_back_to_its_id_and_says_so(tmp_path: Path) -> None:
    from servelab.profile.gpumatch import TelemetryGpu

    trace = container_trace(tmp_path, None)
    w = parse_windows(
        {"windows": [{"label": "w", "start_ns": 0, "end_ns": 2_000_000, "clock": "trace"}]},
        "test",
    )
    sampled = (TelemetryGpu(0, gpu_uuid(0)), TelemetryGpu(3, gpu_uuid(3)))
    prof = analyze_trace([trace], w, TraceOptions(layers=2, telemetry_gpus=sampled)).profile
    (gpu,) = prof["trace"]["gpus"]
    assert (gpu["uuid"], gpu["telemetry_device"], gpu["matched_by"]) == (None, 0, "id")
    assert any("trace GPU 0 has no UUID in the export" in n and "by its id" in n
               for n in prof["notes"])  # fmt: skip


# --- windows that hold no kernel activity -------------------------------------------------


def test_a_window_without_kernel_activity_is_flagged(tmp_path: Path) -> None:
    """A window in the idle gap between c0001 and c0002 (as a point whose window was mapped
    wrongly would be): flagged, with a note; the windows that ran kernels are not."""
    from nsys_fixture import C1_START, FORWARD_PERIOD

    trace = scenario().write(tmp_path / "t.sqlite")
    rows = scenario_windows()
    gap_start = SESSION_START + C1_START + 4 * FORWARD_PERIOD
    rows.insert(1, {"label": "c0009", "start_ns": gap_start, "end_ns": gap_start + 500_000,
                    "clock": "epoch", "output_tokens": 9})  # fmt: skip
    windows = windows_file(tmp_path / "w.json", rows)
    res = analyze_trace([trace], load_windows(windows), TraceOptions(layers=3))
    prof = res.profile
    jsonschema.validate(prof, SCHEMA)
    flags = {label: w["no_kernel_activity"] for label, w in prof["windows"].items()}
    assert flags == {"c0001": False, "c0009": True, "c0002": False}
    assert any(n.startswith("window c0009 holds no kernel activity") for n in prof["notes"])
    assert not any("window c0001 holds" in n or "window c0002 holds" in n for n in prof["notes"])
    from servelab.profile.report import write_profile

    write_profile(tmp_path / "out", prof, res)
    assert (
        "| c0009 | wallclock | - | no kernel activity |"
        in (tmp_path / "out" / "profile.md").read_text()
    )
