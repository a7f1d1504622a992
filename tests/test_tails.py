"""Percentiles with their n and a distribution-free 95% interval (servelab.metrics), and what
the analysis does with one its requests are too few to report: blank in points.csv beside n
and the maximum, 'insufficient' in paired tests, claims and the report."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import servelab_point
from scipy.stats import binom

from servelab.analysis.dataset import load_dataset
from servelab.analysis.groups import Groups, paired_table
from servelab.analysis.pipeline import analysis_section, analyze
from servelab.client import RequestRecord
from servelab.metrics import (
    percentile_interval,
    percentile_of,
    percentile_ranks,
    point_metrics,
    samples_needed,
    supported,
    tail,
)


def test_samples_needed_are_the_fewest_whose_maximum_bounds_the_percentile() -> None:
    assert [samples_needed(p) for p in (50, 90, 95, 99)] == [6, 36, 72, 368]
    for p in (50, 90, 95, 99):
        n = samples_needed(p)
        assert percentile_ranks(n, p)[1] == n  # the largest value is the upper bound
        assert percentile_ranks(n - 1, p)[1] is None  # one fewer: no upper bound at all
        assert supported(n, p) and not supported(n - 1, p)


@pytest.mark.parametrize("n", [6, 20, 64, 368, 500, 1000, 4000])
@pytest.mark.parametrize("p", [50, 90, 95, 99])
def test_the_interval_covers_with_at_least_95_percent_and_is_the_tightest(n: int, p: int) -> None:
    """Exact coverage from the binomial: P(l <= B < u) for B ~ Bin(n, p/100); moving either
    rank inward drops it below 95% on that side."""
    lo, hi = percentile_ranks(n, p)
    if hi is None:
        assert n < samples_needed(p)
        return
    q = p / 100
    lo_ = lo or 0  # no lower order statistic: the interval is open below
    coverage = binom.cdf(hi - 1, n, q) - (binom.cdf(lo_ - 1, n, q) if lo_ else 0.0)
    assert coverage >= 0.95
    assert binom.sf(hi - 1, n, q) <= 0.025 < binom.sf(hi - 2, n, q)  # u is the smallest
    if lo is not None:
        assert binom.cdf(lo - 1, n, q) <= 0.025 < binom.cdf(lo, n, q)  # l is the largest


def _records(ttfts_ms: np.ndarray) -> list[RequestRecord]:
    """A fake server's answers: each request's first token at its TTFT, its second 5 ms on."""
    return [
        RequestRecord(
            request_id=f"r{i}",
            sent_epoch_ns=1_000_000_000 * i,
            chunk_offsets_us=[int(t * 1000), int(t * 1000) + 5000],
            done_offset_us=int(t * 1000) + 5000,
            prompt_tokens=10,
            output_tokens=2,
            ok=True,
            error=None,
            http_status=200,
        )
        for i, t in enumerate(ttfts_ms)
    ]


def test_the_reported_p99_interval_covers_the_true_p99_in_at_least_93_of_100_runs() -> None:
    """A known latency distribution (lognormal TTFT, median 50 ms, sigma 0.5): 100 seeded
    points of 400 requests each, through the metrics the analysis reports."""
    sigma, median = 0.5, 50.0
    true_p99 = median * math.exp(sigma * 2.3263478740408408)  # the normal's 99th percentile
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        ttfts = np.round(median * np.exp(sigma * rng.standard_normal(400)), 3)
        m = point_metrics(_records(ttfts))
        low, high, est = m["p99_ttft_ms_low"], m["p99_ttft_ms_high"], m["p99_ttft_ms"]
        assert low is not None and high is not None and est is not None
        assert low <= est <= high
        covered += low <= true_p99 <= high
    assert covered >= 93


def test_a_p99_of_four_requests_is_never_a_number() -> None:
    m = point_metrics(_records(np.array([10.0, 20.0, 30.0, 63.0])))
    assert m["p99_ttft_ms"] is None and m["p99_ttft_ms_high"] is None
    assert (m["n_ttft"], m["max_ttft_ms"]) == (4, 63.0)
    t = tail([10.0, 20.0, 30.0, 63.0])
    assert t.text(99) == "insufficient (n = 4: max 63.0 ms; p99 needs 368)"
    big = tail([float(i) for i in range(1, 1001)])
    low, high = percentile_interval(np.arange(1.0, 1001.0), 99)
    assert (
        big.text(99)
        == f"{np.percentile(np.arange(1.0, 1001.0), 99):.1f} ms [{low:.1f}, {high:.1f}], n = 1000"
    )


def test_percentile_of_names_the_latency_and_percentile() -> None:
    assert percentile_of("p99_ttft_ms") == ("ttft", 99.0)
    assert percentile_of("median_client_wait_ms") == ("client_wait", 50.0)
    assert percentile_of("p99_ttft_ms_high") is None
    assert percentile_of("mean_ttft_ms") is None
    assert percentile_of("p99_bogus_ms") is None
    assert percentile_of("p90_e2el_ms") == ("e2el", 90.0)


def _tree(root: Path, n: int) -> Path:
    """Two levels, three repeats, n requests per point; c=2 slower than c=1 throughout."""
    for rep in (1, 2, 3):
        servelab_point(root, "a", rep, 1, 100.0 + rep, 20.0 + rep, n=n)
        servelab_point(root, "a", rep, 2, 150.0 + rep, 40.0 + rep, n=n)
    return root


def test_paired_tests_refuse_a_percentile_the_points_cannot_report(tmp_path: Path) -> None:
    analysis = analysis_section(None)
    g = Groups(load_dataset(_tree(tmp_path / "few", 4), analysis.validity))
    rows = {r["metric"]: r for r in paired_table(g, analysis)}
    p99 = rows["p99_ttft_ms"]
    assert p99["p_value"] is None
    assert p99["verdict"] == (
        "insufficient: c=1 a (n = 4 in 3 of 3 repeats: max 23.0 ms; p99 needs 368); "
        "c=2 a (n = 4 in 3 of 3 repeats: max 43.0 ms; p99 needs 368)"
    )
    assert rows["mean_ttft_ms"]["p_value"] is not None  # a mean is tested as before
    many = Groups(load_dataset(_tree(tmp_path / "many", 400), analysis.validity))
    p99 = {r["metric"]: r for r in paired_table(many, analysis)}["p99_ttft_ms"]
    assert p99["p_value"] is not None and not p99["verdict"].startswith("insufficient")


def test_points_csv_report_and_claims_say_insufficient(tmp_path: Path) -> None:
    root = _tree(tmp_path / "exp", 4)
    analysis = analysis_section(
        {"claims": ["p99_ttft_ms[c=2] > p99_ttft_ms[c=1]", "mean_ttft_ms[c=2] > mean_ttft_ms[c=1]"]}
    )
    out = tmp_path / "analysis"
    analyze(root, out, analysis, figures=False)
    with open(out / "points.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["p99_ttft_ms"] == "" and rows[0]["n_ttft"] == "4"
    assert float(rows[0]["max_ttft_ms"]) == pytest.approx(21.0)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "insufficient (n = 12: max 23.0 ms; p99 needs 368)" in report  # 3 repeats pooled
    claims = {c["claim"]: c for c in json.loads((out / "claims.json").read_text())}
    p99 = claims["p99_ttft_ms[c=2] > p99_ttft_ms[c=1]"]
    assert p99["verdict"] == "inconclusive" and p99["reason"].startswith("insufficient: ")
    assert claims["mean_ttft_ms[c=2] > mean_ttft_ms[c=1]"]["verdict"] == "holds"


def test_a_claim_on_a_p99_the_points_cannot_report_is_named_before_measuring() -> None:
    import yaml

    from servelab.analysis.tails import named_percentiles, tail_notes
    from servelab.config import validate

    raw = yaml.safe_load(Path("config/config.yaml").read_text(encoding="utf-8"))
    assert tail_notes(validate(raw)) == []  # the default's claims are on means
    raw["analysis"]["claims"] = ["p99_ttft_ms[config=max-num-seqs-8,c=16] < 5000"]
    (note,) = tail_notes(validate(raw))
    assert note.startswith("tails: a claim names p99_ttft_ms: a point needs 368 requests")
    assert "the smallest here sends 4 (concurrency 1 x workload.waves 4)" in note
    assert note.endswith("set workload.waves to at least 368")
    raw["workload"]["waves"] = 368
    assert tail_notes(validate(raw)) == []
    assert named_percentiles(
        ("median_tpot_ms[c=1] < p99_itl_ms[c=2]", "mean_ttft_ms[c=1] < 3")
    ) == [
        "median_tpot_ms",
        "p99_itl_ms",
    ]
