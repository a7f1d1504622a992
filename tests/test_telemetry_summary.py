"""Samples aligned to point windows; flat columns; utilization vs throughput; the figure; CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from servelab.cli import main
from servelab.store.paths import TELEMETRY_FIGURE
from servelab.telemetry import (
    COLUMNS,
    ENERGY_COLUMNS,
    plot_utilization_vs_throughput,
    summarize,
    telemetry_columns,
    utilization_pct,
    utilization_vs_throughput,
    write_samples,
)
from servelab.telemetry.summary import histogram_quantile

S = 10**9  # ns per second
T0 = 1_800_000_000 * S


def server(t: float, running: float, waiting: float, gen: float, **over: Any) -> dict[str, Any]:
    return {
        "source": "server",
        "epoch_ns": T0 + int(t * S),
        "running": running,
        "waiting": waiting,
        "kv_cache_usage": running / 100,
        "preemptions_total": over.pop("pre", 0.0),
        "generation_tokens_total": gen,
        "prompt_tokens_total": gen / 2,
        "ttft_s": over.pop("ttft", None),
        "itl_s": None,
        **over,
    }


def cpu(t: float, server_cpu_s: float, pct: float | None) -> dict[str, Any]:
    return {
        "source": "cpu",
        "epoch_ns": T0 + int(t * S),
        "server_cpu_s": server_cpu_s,
        "server_cpu_pct": pct,
        "client_cpu_s": server_cpu_s / 10,
        "client_cpu_pct": None if pct is None else pct / 10,
        "telemetry_cpu_s": 0.0,
        "telemetry_cpu_pct": 0.0,
        "host_cpu_pct": 50.0,
        "host_cpus": 2,
        "server_rss_bytes": 1000 + t,
        "client_rss_bytes": 10,
        "host_mem_used_bytes": 5,
    }


def window(a: float, b: float) -> tuple[int, int]:
    return T0 + int(a * S), T0 + int(b * S)


def test_samples_outside_the_window_are_left_out() -> None:
    samples = [server(0, 100, 50, 0)]  # a burst before the point
    samples += [server(t, 4, w, 100 * t) for t, w in [(1, 0), (2, 2), (3, 0), (4, 3), (5, 0)]]
    samples += [server(6, 200, 90, 600, pre=7)]  # and one after it
    s = summarize(samples, *window(0.5, 5.5))["server"]
    assert s["samples"] == 5
    assert s["running"] == {"mean": 4.0, "p95": 4.0, "max": 4.0}
    assert s["waiting"]["max"] == 3.0 and s["waiting"]["mean"] == pytest.approx(1.0)
    assert s["waiting_fraction"] == pytest.approx(2 / 5)
    assert s["kv_cache_usage"]["max"] == pytest.approx(0.04)
    # counters: the last sample at or before the start to the first at or after the end
    assert s["generation_tokens"] == 600.0 and s["prompt_tokens"] == 300.0
    assert s["preemptions"] == 7.0
    assert s["generation_tokens_per_s"] == pytest.approx(100.0)


def test_prefix_cache_and_finished_request_counters_over_the_window() -> None:
    def at(t: float, queries: float, hits: float, done: float) -> dict[str, Any]:
        return server(
            t,
            1,
            0,
            10 * t,
            prefix_cache_queries_total=queries,
            prefix_cache_hits_total=hits,
            requests_finished_total=done,
        )

    samples = [at(0, 100, 0, 2), at(1, 228, 0, 3), at(2, 484, 64, 5), at(3, 740, 64, 7)]
    s = summarize(samples, *window(1, 3))["server"]
    assert s["prefix_cache_queries"] == 512.0
    assert s["prefix_cache_hits"] == 64.0
    assert s["requests_finished"] == 4.0
    cols = telemetry_columns(summarize(samples, *window(1, 3)))
    assert cols["server_prefix_cache_queries"] == 512.0
    assert cols["server_prefix_cache_hits"] == 64.0
    assert cols["server_requests_finished"] == 4.0
    # a server that does not export them (older samples): null, not zero
    old = summarize([server(t, 1, 0, 10 * t) for t in (0, 1, 2)], *window(0, 2))["server"]
    assert old["prefix_cache_queries"] is None and old["requests_finished"] is None


def test_the_server_counters_run_to_the_closing_scrape() -> None:
    """A periodic scrape just after the point can miss its last step (vLLM counts a step's
    tokens just after streaming them): the server's counters and histograms run to the closing
    scrape, taken once they settled; the token rate stays over the nearest samples."""
    samples = [server(0, 0, 0, 0, requests_finished_total=0)]
    samples.append(server(2.01, 4, 0, 240, requests_finished_total=7))  # one step short
    samples.append(server(2.3, 0, 0, 256, requests_finished_total=8))  # the closing scrape
    s = summarize(samples, *window(0, 2))["server"]
    assert s["generation_tokens"] == 256.0 and s["requests_finished"] == 8.0
    assert s["generation_tokens_per_s"] == pytest.approx(256 / 2.01)


def test_counters_without_a_sample_before_the_start_use_the_first() -> None:
    samples = [server(t, 1, 0, 10 * t) for t in (2, 3, 4)]
    s = summarize(samples, *window(1, 3.5))["server"]
    assert s["generation_tokens"] == 20.0  # from t=2 (first) to t=4 (first at/after the end)
    assert s["samples"] == 2


def test_scrape_errors_are_counted_and_not_read_as_values() -> None:
    samples = [
        server(1, 2, 0, 10),
        {"source": "server", "epoch_ns": T0 + 2 * S, "error": "Timeout"},
    ]
    samples.append(server(3, 6, 0, 30))
    s = summarize(samples, *window(0.5, 3.5))["server"]
    assert s["errors"] == 1 and s["last_error"] == "Timeout"
    assert s["samples"] == 2 and s["running"]["max"] == 6.0


def test_cpu_mean_comes_from_cpu_seconds_across_the_point() -> None:
    # the server used 3 CPU seconds in 2 s (150% of a core); interval samples say 100 and 200
    samples = [cpu(1, 10.0, None), cpu(2, 11.0, 100.0), cpu(3, 13.0, 200.0)]
    c = summarize(samples, *window(1, 3))["cpu"]
    assert c["server_cpu_s"] == pytest.approx(3.0)
    assert c["server_cpu_pct"]["mean"] == pytest.approx(150.0)
    assert c["server_cpu_pct"]["max"] == 200.0
    assert c["client_cpu_pct"]["mean"] == pytest.approx(15.0)
    assert c["host_cpus"] == 2 and c["samples"] == 3
    assert c["server_rss_bytes"]["max"] == pytest.approx(1003.0)


def test_histogram_quantile_like_prometheus() -> None:
    buckets = [[0.1, 50.0], [0.2, 90.0], [0.4, 100.0]]
    assert histogram_quantile(0.5, buckets, 100.0) == pytest.approx(0.1)
    assert histogram_quantile(0.95, buckets, 100.0) == pytest.approx(0.3)
    assert histogram_quantile(0.95, buckets, 200.0) == pytest.approx(0.4)  # in +Inf: last bound
    assert histogram_quantile(0.5, buckets, 0.0) is None


def test_histogram_difference_over_the_point() -> None:
    before = {"count": 10.0, "sum": 1.0, "buckets": [[0.1, 10.0], [0.2, 10.0]]}
    after = {"count": 30.0, "sum": 4.0, "buckets": [[0.1, 10.0], [0.2, 30.0]]}
    samples = [server(0, 0, 0, 0, ttft=before), server(5, 0, 0, 0, ttft=after)]
    ttft = summarize(samples, *window(1, 4))["server"]["ttft"]
    assert ttft["count"] == 20.0
    assert ttft["mean_ms"] == pytest.approx(150.0)
    assert ttft["p95_ms"] == pytest.approx(195.0)


def test_columns_are_flat_and_stable() -> None:
    gpu = [
        {
            "source": "gpu",
            "epoch_ns": T0 + 2 * S,
            "device": d,
            "util_pct": u,
            "power_w": 100.0 * (d + 1),
        }
        for d, u in [(0, 90.0), (1, 100.0)]
    ]
    samples = [server(1, 3, 0, 0), server(2, 8, 5, 50), server(3, 0, 0, 99), cpu(1, 0, None)]
    samples += [cpu(2, 1.0, 100.0), cpu(3, 2.0, 100.0), *gpu]
    cols = telemetry_columns(summarize(samples, *window(1.5, 2.5)))
    assert tuple(cols) == (*COLUMNS, *ENERGY_COLUMNS)
    # the columns added later come last, after the earlier ones
    assert COLUMNS[-3:] == (
        "server_prefix_cache_queries",
        "server_prefix_cache_hits",
        "server_requests_finished",
    )
    assert COLUMNS.index("telemetry_samples_server") == len(COLUMNS) - 4
    assert cols["running_max"] == 8.0 and cols["waiting_max"] == 5.0
    assert cols["waiting_fraction"] == 1.0 and cols["kv_usage_max"] == pytest.approx(0.08)
    assert cols["gpu_util_pct_mean"] == pytest.approx(95.0) and cols["gpu_util_pct_max"] == 100.0
    assert cols["gpu_power_w_max"] == 200.0 and cols["gpu_devices"] == 2
    assert cols["utilization_pct"] == pytest.approx(95.0)  # the GPUs', not the CPU's
    assert cols["cpu_server_util_pct_mean"] == pytest.approx(100.0)
    assert cols["server_generation_tokens"] == 99.0 and cols["gpu_absent"] is None
    empty = telemetry_columns(None)
    assert tuple(empty) == (*COLUMNS, *ENERGY_COLUMNS)
    assert empty["gpu_absent"] == empty["energy_absent"] == "no telemetry recorded"


def _point(
    sc: str, conc: int, rep: int, tput: float, util: float, gpu: bool = False
) -> dict[str, Any]:
    samples = [cpu(0, 0.0, None), cpu(1, util / 100, util)]
    if gpu:
        samples.append({"source": "gpu", "epoch_ns": T0 + S // 2, "device": 0, "util_pct": util})
    else:
        samples.append({"source": "gpu", "epoch_ns": T0, "absent": "NVML unavailable: test"})
    return {
        "server_config": sc,
        "concurrency": conc,
        "repeat": rep,
        "output_throughput": tput,
        "mean_ttft_ms": 10.0,
        "telemetry": summarize(samples, *window(0, 1)),
    }


def test_utilization_vs_throughput_rows() -> None:
    pts = [_point("mns-8", 8, 1, 3400.0, 190.0), _point("mns-1", 8, 1, 600.0, 100.0)]
    pts.append(_point("mns-1", 1, 1, 590.0, 99.0))
    rows = utilization_vs_throughput(pts)
    assert [(r["server_config"], r["concurrency"]) for r in rows] == [
        ("mns-1", 1),
        ("mns-1", 8),
        ("mns-8", 8),
    ]
    busy = rows[1]
    assert busy["utilization_source"] == "cpu" and busy["server_cpu_pct"] == pytest.approx(100.0)
    assert busy["utilization_pct"] == pytest.approx(50.0)  # of the host's 2 cores
    assert busy["fraction_of_best_throughput"] == pytest.approx(600 / 3400)
    assert rows[2]["fraction_of_best_throughput"] == 1.0
    assert utilization_pct(pts[0]["telemetry"]) == pytest.approx(95.0)  # 190% of 2 cores
    assert utilization_pct(None) is None
    (g,) = utilization_vs_throughput([_point("g", 4, 1, 10.0, 97.0, gpu=True)])
    assert g["utilization_source"] == "gpu" and g["utilization_pct"] == 97.0


def test_figure_is_byte_for_byte_reproducible(tmp_path: Path) -> None:
    rows = utilization_vs_throughput(
        [_point("mns-1", c, r, 600.0 + r, 100.0 + c) for c in (1, 8) for r in (1, 2)]
        + [_point("mns-8", c, 1, 400.0 * c, 40.0 * c) for c in (1, 8)]
    )
    one = plot_utilization_vs_throughput(rows, tmp_path / "a")
    two = plot_utilization_vs_throughput(rows, tmp_path / "b")
    assert [p.name for p in one] == [f"{TELEMETRY_FIGURE}.svg", f"{TELEMETRY_FIGURE}.png"]
    for a, b in zip(one, two, strict=True):
        assert a.read_bytes() == b.read_bytes() and len(a.read_bytes()) > 1000
    svg = one[0].read_text()
    assert "<dc:date>" not in svg and "mns-8" in svg and "of all the host's cores (2)" in svg


def test_cli_summarize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp"
    for sc, conc, tput, util in [("mns-1", 8, 600.0, 100.0), ("mns-8", 8, 3400.0, 180.0)]:
        pdir = exp / "raw" / sc / "rep01" / f"c{conc:04d}"
        pdir.mkdir(parents=True)
        point = {"format_version": 1, "status": "complete", **_point(sc, conc, 1, tput, util)}
        (pdir / "point.json").write_text(json.dumps(point))
        write_samples(pdir / "telemetry.jsonl", [])
    assert main(["telemetry", "summarize", str(exp)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["server", "config", "conc", "rep", "tok/s"]
    assert lines[2].split()[:6] == ["mns-1", "8", "1", "600.0", "50", "100"]
    assert "GPU telemetry absent: NVML unavailable: test" in out
    with open(exp / "telemetry" / "points.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["server_config"] for r in rows] == ["mns-1", "mns-8"]
    assert float(rows[1]["cpu_server_util_pct_mean"]) == pytest.approx(180.0)
    assert (exp / "telemetry" / "utilization_vs_throughput.svg").exists()
    assert main(["telemetry", "summarize", str(tmp_path / "nope")]) == 2
    assert "no raw/ folder" in capsys.readouterr().err


def test_points_csv_carries_each_points_telemetry(tmp_path: Path) -> None:
    """analysis/points.csv: the telemetry columns filled from each point's telemetry block."""
    from analysis_fixtures import servelab_point

    from servelab.analysis.pipeline import analyze

    exp = tmp_path / "exp"
    for rep in (1, 2):
        for conc, util in ((1, 99.0), (8, 190.0)):
            block = _point("mns-8", conc, rep, 100.0 * conc, util)["telemetry"]
            servelab_point(exp, "mns-8", rep, conc, 100.0 * conc, 10.0, telemetry=block)
    analyze(exp, tmp_path / "out", name="exp", figures=False)
    with (tmp_path / "out" / "points.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["concurrency"] for r in rows] == ["1", "1", "8", "8"]
    assert [float(r["utilization_pct"]) for r in rows] == pytest.approx([49.5, 49.5, 95.0, 95.0])
    assert all(r["gpu_absent"] == "NVML unavailable: test" for r in rows)
    assert all(float(r["cpu_server_util_pct_mean"]) > 0 for r in rows)


def test_host_steal_is_summarized_beside_host_cpu() -> None:
    samples = [cpu(t, 10.0 + t, 100.0) for t in (1, 2, 3)]
    for s, steal in zip(samples, (None, 10.0, 30.0), strict=True):
        s["host_steal_pct"] = steal
    c = summarize(samples, *window(1, 3))["cpu"]
    assert c["host_steal_pct"] == {"mean": 20.0, "p95": pytest.approx(29.0), "max": 30.0}
    # samples of a platform without steal time (or of an older servelab): null statistics
    old = summarize([cpu(t, 10.0 + t, 100.0) for t in (1, 2, 3)], *window(1, 3))["cpu"]
    assert old["host_steal_pct"] == {"mean": None, "p95": None, "max": None}
    assert old["host_cpu_pct"]["mean"] == 50.0


def test_host_busy_mean_is_over_the_span_the_cpu_seconds_are_read_across() -> None:
    """The host's busy percent is averaged over the same span as the processes' CPU seconds
    (the sample before the point to the one after it), each sample's percent weighted by its
    interval; a point shorter than a sampling period has one from the closing sample."""
    samples = [cpu(t, 10.0 * t, 100.0) for t in (0, 1, 1.5)]
    for s, busy in zip(samples, (None, 100.0, 40.0), strict=True):
        s["host_cpu_pct"] = busy
    c = summarize(samples, *window(0.2, 1.2))["cpu"]
    assert c["samples"] == 1  # the sample at 1 s alone is inside
    assert c["host_cpu_pct"]["mean"] == pytest.approx((100.0 * 1 + 40.0 * 0.5) / 1.5)
    assert c["host_cpu_pct"]["max"] == 100.0  # p95 and max: the samples inside, as before
    short = summarize(samples, *window(1.1, 1.2))["cpu"]
    assert short["samples"] == 0 and short["host_cpu_pct"]["mean"] == pytest.approx(40.0)
