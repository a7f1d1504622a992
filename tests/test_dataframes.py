"""servelab.points() and servelab.requests() on hand-built trees of both layouts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from analysis_fixtures import KNEE_SPEC, servelab_point, vllm_bench_tree

import servelab
from servelab.analysis.pipeline import analyze
from servelab.config import load as load_config
from servelab.render import csv_text
from servelab.telemetry.columns import COLUMNS as TELEMETRY_COLUMNS

SPEC = {  # server_config -> concurrency -> [(tokens/s, TTFT ms) per repeat]
    "a": {1: [(100.0, 20.0), (110.0, 22.0)], 4: [(300.0, 40.0), (320.0, 44.0)]},
    "b": {1: [(90.0, 30.0), (95.0, 31.0)], 4: [(250.0, 60.0), (260.0, 62.0)]},
}


def experiment(tmp_path: Path, failed: int = 0, telemetry: bool = False) -> Path:
    """SPEC's points, of which b, rep 2, c=4 has `failed` failed requests (HTTP 500) and an
    incomplete point that neither table shows."""
    exp = tmp_path / "exp"
    for sc, levels in SPEC.items():
        for conc, reps in levels.items():
            for r, (tput, ttft) in enumerate(reps, 1):
                bad = failed if (sc, r, conc) == ("b", 2, 4) else 0
                tel = {"format": 1} if telemetry and sc == "a" else None
                servelab_point(exp, sc, r, conc, tput, ttft, failed=bad, telemetry=tel)
    servelab_point(exp, "a", 3, 1, 1000.0, 1.0, status="incomplete")
    return exp


def as_csv(df: pd.DataFrame) -> str:
    """The frame as the analysis writes a CSV (NaN as an empty cell)."""
    rows = [
        [None if isinstance(v, float) and math.isnan(v) else v for v in row]
        for row in df.astype(object).itertuples(index=False)
    ]
    return csv_text(list(df.columns), rows)


def test_points_of_an_experiment_are_points_csv(tmp_path: Path) -> None:
    exp = experiment(tmp_path, failed=1)
    analyze(exp, tmp_path / "analysis", figures=False)
    df = servelab.points(exp)
    assert as_csv(df) == (tmp_path / "analysis" / "points.csv").read_text()
    assert len(df) == 8  # the incomplete point is not measured
    assert list(df[["server_config", "concurrency", "repeat"]].itertuples(index=False)) == [
        (sc, c, r) for sc in ("a", "b") for c in (1, 4) for r in (1, 2)
    ]
    row = df.set_index(["server_config", "concurrency", "repeat"]).loc[("a", 4, 2)]
    assert row["output_throughput"] == pytest.approx(320.0, rel=1e-6)
    assert row["mean_ttft_ms"] == pytest.approx(44.0)
    assert row["completed"] == 8 and row["failed"] == 0
    assert df["valid"].dtype == bool and df["position"].dtype == "int64"
    bad = df[(df.server_config == "b") & (df.concurrency == 4) & (df.repeat == 2)].iloc[0]
    assert bad["failed"] == 1 and not bad["valid"]
    assert bad["invalid_reasons"].startswith("failed_requests:")
    assert df["valid"].sum() == 7
    # values at full precision: the CSV's 6 significant digits are the CSV's
    assert df["duration"].tolist() == pytest.approx(
        [2 * 100 / 100, 2 * 100 / 110, 8 * 100 / 300, 8 * 100 / 320]
        + [2 * 100 / 90, 2 * 100 / 95, 8 * 100 / 250, 7 * 100 / 260],
        abs=1e-6,
    )


def test_points_take_the_validity_thresholds_of_a_config(tmp_path: Path, repo: Path) -> None:
    exp = experiment(tmp_path, failed=1)
    overrides = {"analysis": {"validity": {"max_failed_requests": 1}}}
    lenient = load_config(repo / "config" / "config.yaml", overrides)
    assert servelab.points(exp, config=lenient)["valid"].all()
    assert not servelab.points(exp, config=repo / "config" / "config.yaml")["valid"].all()


def test_points_with_telemetry_have_its_columns(tmp_path: Path) -> None:
    exp = experiment(tmp_path, telemetry=True)
    analyze(exp, tmp_path / "analysis", figures=False)
    df = servelab.points(exp)
    assert list(df.columns[-len(TELEMETRY_COLUMNS) :]) == list(TELEMETRY_COLUMNS)
    assert as_csv(df) == (tmp_path / "analysis" / "points.csv").read_text()
    assert "utilization_pct" not in servelab.points(experiment(tmp_path / "2")).columns


def test_requests_of_an_experiment(tmp_path: Path) -> None:
    exp = experiment(tmp_path, failed=3)
    req = servelab.requests(exp)
    pts = servelab.points(exp)
    assert len(req) == int(pts["num_prompts"].sum()) == 2 * (2 + 2 + 8 + 8)
    assert list(req.columns[:12]) == [
        "server_config",
        "repeat",
        "concurrency",
        "request",
        "ok",
        "error",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "e2el_ms",
        "itl_ms",
    ]
    assert {"request_id", "sent_epoch_ns", "chunk_offsets_us", "queued_us"} <= set(req.columns)
    failed = req[~req["ok"]]
    assert len(failed) == 3
    assert set(failed["request_id"]) == {f"b-r02-c0004-{i:05d}" for i in range(3)}
    assert (failed["error"] == "HTTP 500: boom").all() and failed["ttft_ms"].isna().all()
    assert failed["http_status"].tolist() == [500] * 3
    one = req[(req.server_config == "a") & (req.concurrency == 4) & (req.repeat == 2)]
    assert one["request"].tolist() == list(range(8))
    assert one["ttft_ms"].tolist() == pytest.approx([44.0] * 8)
    assert one["output_tokens"].tolist() == [100] * 8
    assert (one["itl_ms"].map(len) == 99).all()
    assert one["e2el_ms"].iloc[0] == pytest.approx(
        one["ttft_ms"].iloc[0] + sum(one["itl_ms"].iloc[0])
    )
    assert one["tpot_ms"].iloc[0] == pytest.approx((8 * 100 / 320 * 1000 - 44.0) / 99, rel=1e-4)
    # the points' numbers, recomputed from the requests
    good = req[req["ok"]]
    by = good.groupby(["server_config", "concurrency", "repeat"])
    keyed = pts.set_index(["server_config", "concurrency", "repeat"])
    assert by["ttft_ms"].mean().to_numpy() == pytest.approx(keyed["mean_ttft_ms"].to_numpy())
    # a median is reported where a point holds the 6 requests its 95% interval needs
    medians, reported = by["e2el_ms"].median(), keyed["median_e2el_ms"].notna()
    assert reported.any() and (keyed["n_e2el"][~reported] < 6).all()
    assert medians[reported].to_numpy() == pytest.approx(
        keyed["median_e2el_ms"][reported].to_numpy()
    )
    assert by.size().tolist() == keyed["completed"].tolist()
    assert by["output_tokens"].sum().tolist() == keyed["total_output_tokens"].tolist()


def bench_tree(tmp_path: Path, with_latencies: bool = True) -> Path:
    root = vllm_bench_tree(tmp_path / "h100", KNEE_SPEC, with_latencies=with_latencies)
    bj = root / "rep_02" / "concurrency_064" / "benchmark.json"
    bench: dict[str, Any] = json.loads(bj.read_text())
    bench["errors"][5] = "Timeout"
    bench["output_lens"][6] = 0
    bench["generated_texts"] = [f"text {i}" for i in range(len(bench["ttfts"]))]
    bj.write_text(json.dumps(bench))
    return root


def test_points_of_a_vllm_bench_tree_are_points_csv(tmp_path: Path) -> None:
    root = bench_tree(tmp_path)
    analyze(root, tmp_path / "analysis", name="a100", figures=False)
    df = servelab.points(root, name="a100")
    assert as_csv(df) == (tmp_path / "analysis" / "points.csv").read_text()
    assert set(df["server_config"]) == {"a100"} and df["position"].isna().all()
    assert set(servelab.points(root)["server_config"]) == {"h100"}  # the folder's name
    assert df["concurrency"].tolist() == [64] * 3 + [128] * 3 + [256] * 3
    row = df[(df.concurrency == 128) & (df.repeat == 2)].iloc[0]
    assert row["output_throughput"] == pytest.approx(5005.0)
    assert row["mean_ttft_ms"] == pytest.approx(418.0)
    bad = df[(df.concurrency == 64) & (df.repeat == 2)].iloc[0]
    assert (bad["num_prompts"], bad["completed"], bad["failed"]) == (128, 126, 2)


@pytest.mark.parametrize("with_latencies", [True, False])
def test_requests_of_a_vllm_bench_tree(tmp_path: Path, with_latencies: bool) -> None:
    root = bench_tree(tmp_path, with_latencies)
    req = servelab.requests(root, name="a100")
    assert len(req) == sum(2 * c * 3 for c in KNEE_SPEC)
    assert list(req.columns) == [
        "server_config",
        "repeat",
        "concurrency",
        "request",
        "ok",
        "error",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "e2el_ms",
        "itl_ms",
        "generated_texts",
        "start_times",
    ]
    pt = req[(req.concurrency == 64) & (req.repeat == 2)].set_index("request")
    assert pt.loc[5, "error"] == "Timeout" and not pt.loc[5, "ok"]
    assert pt.loc[6, "output_tokens"] == 0 and not pt.loc[6, "ok"]
    assert pd.isna(pt.loc[6, "error"]) and pd.isna(pt.loc[6, "ttft_ms"])
    assert pt.loc[7, "generated_texts"] == "text 7" and pt["generated_texts"].notna().all()
    other = req[(req.concurrency == 128) & (req.repeat == 1)]
    assert other["generated_texts"].isna().all()  # that file has none
    assert (req["start_times"] == 0.0).all()
    assert other["ok"].all() and other["prompt_tokens"].tolist() == [10] * 256
    duration_ms = 256 * 50 / 4990.0 * 1000
    assert other["ttft_ms"].tolist() == pytest.approx([420.0] * 256)
    assert other["e2el_ms"].tolist() == pytest.approx([duration_ms] * 256)
    assert other["tpot_ms"].iloc[0] == pytest.approx((duration_ms - 420.0) / 49)
    assert len(other["itl_ms"].iloc[0]) == 49
    pts = servelab.points(root, name="a100").set_index(["concurrency", "repeat"])
    by = req[req["ok"]].groupby(["concurrency", "repeat"])
    assert by["e2el_ms"].mean().to_numpy() == pytest.approx(pts["mean_e2el_ms"].to_numpy())
    assert by["tpot_ms"].mean().to_numpy() == pytest.approx(pts["mean_tpot_ms"].to_numpy())
    assert by.size().tolist() == pts["completed"].tolist()


def test_not_an_experiment_is_refused(tmp_path: Path) -> None:
    from servelab.errors import ServelabError

    with pytest.raises(ServelabError, match="neither servelab raw data"):
        servelab.requests(tmp_path)
    with pytest.raises(ServelabError, match="neither servelab raw data"):
        servelab.points(tmp_path)


def test_import_servelab_loads_neither_pandas_nor_the_analysis() -> None:
    code = (
        "import sys, servelab, servelab.client, servelab.config\n"
        "print(sorted(m for m in ('pandas', 'servelab.dataframes', 'servelab.analysis')"
        " if m in sys.modules))\n"
        "servelab.points\n"
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        servelab.nothing  # type: ignore[attr-defined]  # noqa: B018
