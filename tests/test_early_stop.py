"""Early stopping on a share of requests (servelab.analysis.early_stop): the Clopper-Pearson
bounds against known values, the decision rule and its words, the fewest requests that can meet
a p99 SLO; the known answer: latencies drawn from a lognormal whose true p99 lies 20% inside or
20% outside the limit are decided as the truth says; and slo.json's decisions on a raw tree."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import servelab_point
from scipy.stats import binom, norm

from servelab.analysis.early_stop import (
    Decision,
    allowed_share,
    clopper_pearson,
    decide,
    min_requests,
)
from servelab.analysis.pipeline import analysis_section, analyze

# --- the bounds -----------------------------------------------------------------------------


def test_the_upper_bound_of_none_over_is_the_closed_form() -> None:
    """k = 0: the upper bound solves (1 - p)^n = 1 - confidence; 299 requests give 0.997%."""
    lower, upper = clopper_pearson(0, 299)
    assert lower == 0.0
    assert upper == pytest.approx(0.009969146792899, rel=1e-9)
    assert upper == pytest.approx(1 - 0.05 ** (1 / 299), rel=1e-12)
    for n in (1, 10, 64, 1000):
        assert clopper_pearson(0, n)[1] == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
        # k = n: the lower bound solves p^n = 1 - confidence
        assert clopper_pearson(n, n) == (pytest.approx(0.05 ** (1 / n), rel=1e-9), 1.0)


def test_the_bounds_of_5_in_100() -> None:
    """The published two-sided 95% interval of 5 in 100 is 1.64%-11.28% (each side 97.5%);
    one-sided at 95% each bound is 1.99% and 10.23%."""
    lo, hi = clopper_pearson(5, 100, confidence=0.975)
    assert (lo, hi) == (pytest.approx(0.016432, abs=2e-6), pytest.approx(0.112835, abs=2e-6))
    lo, hi = clopper_pearson(5, 100)
    assert (lo, hi) == (pytest.approx(0.019906, abs=2e-6), pytest.approx(0.102253, abs=2e-6))


@pytest.mark.parametrize(("k", "n"), [(1, 10), (3, 64), (5, 100), (12, 320), (40, 2000)])
def test_the_bounds_are_where_the_binomial_tails_are_five_percent(k: int, n: int) -> None:
    """The definition: at the upper bound P(X <= k) = 5%, at the lower P(X >= k) = 5%."""
    lo, hi = clopper_pearson(k, n)
    assert binom.cdf(k, n, hi) == pytest.approx(0.05, abs=1e-9)
    assert binom.sf(k - 1, n, lo) == pytest.approx(0.05, abs=1e-9)
    assert lo < k / n < hi


def test_no_requests_say_nothing() -> None:
    assert clopper_pearson(0, 0) == (0.0, 1.0)
    d = decide(0, 0, 0.01)
    assert d.decision == "undecided" and d.text() == "undecided: no requests (needs >= 299)"


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (1.5, 5)])
def test_counts_that_are_not_counts_are_refused(k: float, n: int) -> None:
    with pytest.raises(ValueError, match=r"give whole numbers with 0 <= k <= n$"):
        clopper_pearson(k, n)  # type: ignore[arg-type]


# --- the decision ---------------------------------------------------------------------------


def test_a_p99_slo_needs_299_requests() -> None:
    assert allowed_share(0.99) == 0.01
    assert min_requests(0.01) == 299
    assert decide(299, 0, 0.01).decision == "meets"
    assert decide(298, 0, 0.01).decision == "undecided"
    assert min_requests(0.05) == 59 and min_requests(0.1) == 29 and min_requests(0.001) == 2995
    assert min_requests(0.0) is None  # no number of requests shows that none will miss
    with pytest.raises(ValueError, match="allowed share 1"):
        min_requests(1)


@pytest.mark.parametrize(
    ("n", "k", "decision", "text"),
    [
        (320, 0, "meets", "meets: 0 of 320 over (upper 0.93%, allowed 1%)"),
        (64, 0, "undecided", "undecided: 0 of 64 over (upper 4.6% > 1%; needs >= 299)"),
        (320, 12, "fails", "fails: 12 of 320 over (lower 2.2% > 1%)"),
        (400, 4, "undecided", "undecided: 4 of 400 over (lower 0.34% <= 1% < upper 2.3%)"),
        (299, 0, "meets", "meets: 0 of 299 over (upper 0.997%, allowed 1%)"),
        (298, 0, "undecided", "undecided: 0 of 298 over (upper 1.0002% > 1%; needs >= 299)"),
        (64, 4, "fails", "fails: 4 of 64 over (lower 2.2% > 1%)"),
    ],
)
def test_the_decision_and_its_words(n: int, k: int, decision: str, text: str) -> None:
    d = decide(n, k, 0.01)
    assert isinstance(d, Decision)
    assert (d.decision, d.n, d.k, d.allowed) == (decision, n, k, 0.01)
    assert d.lower <= k / n <= d.upper
    assert d.text() == text


def test_the_rule_is_the_bounds_against_the_allowed_share() -> None:
    for n in (50, 299, 1000):
        for k in range(0, n // 10):
            d = decide(n, k, 0.01)
            want = "meets" if d.upper <= 0.01 else "fails" if d.lower > 0.01 else "undecided"
            assert d.decision == want, (n, k)


def test_a_target_of_every_request_is_never_met() -> None:
    d = decide(10_000, 0, allowed_share(1.0))
    assert d.decision == "undecided"
    assert d.text().endswith("no number of requests can meet it)")
    assert decide(10_000, 1, 0.0).decision == "fails"


# --- the known answer -----------------------------------------------------------------------

SIGMA = 0.4  # the lognormal's log-sd: a tail like a served model's latencies
MEDIAN_MS = 800.0
TRUE_P99_MS = MEDIAN_MS * math.exp(SIGMA * float(norm.ppf(0.99)))


def decisions(limit_ms: float, n: int, draws: int = 100) -> list[str]:
    """The decision on `draws` seeded samples of n latencies against `limit_ms` (p99 SLO)."""
    out = []
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        lat = rng.lognormal(math.log(MEDIAN_MS), SIGMA, size=n)
        k = int(np.count_nonzero(lat > limit_ms))
        out.append(decide(n, k, allowed_share(0.99)).decision)
    return out


def test_a_p99_20_percent_inside_the_limit_meets() -> None:
    """Limit = 1.2 x the true p99: the true share over is 0.27%; 2000 requests meet in at least
    95 of 100 draws and never fail."""
    got = decisions(1.2 * TRUE_P99_MS, 2000)
    assert got.count("meets") >= 95, got
    assert "fails" not in got


def test_a_p99_20_percent_outside_the_limit_fails() -> None:
    """Limit = the true p99 / 1.2: the true share over is 3.1%; 2000 requests fail in at
    least 95 of 100 draws and never meet."""
    got = decisions(TRUE_P99_MS / 1.2, 2000)
    assert got.count("fails") >= 95, got
    assert "meets" not in got


def test_64_requests_leave_a_p99_inside_the_limit_undecided() -> None:
    """The same server, 64 requests a point: too few to meet a p99 SLO; undecided, never
    meets (nor fails)."""
    got = decisions(1.2 * TRUE_P99_MS, 64)
    assert got == ["undecided"] * 100


# --- slo.json -------------------------------------------------------------------------------


def slo_of(tmp_path: Path, points: list[tuple[int, int, float, int, int]]) -> dict:  # type: ignore[type-arg]
    """slo.json of a tree of one configuration `a`: (repeat, concurrency, TTFT ms, requests,
    failed) per point, throughput 100 x concurrency; SLO p99 TTFT <= 500 ms; up to 10 failed
    requests a point pass the validity checks."""
    exp = tmp_path / "exp"
    for rep, conc, ttft, n, failed in points:
        servelab_point(exp, "a", rep, conc, 100.0 * conc, ttft, n=n, failed=failed)
    opts = analysis_section(
        {"slo": {"p99_ttft_ms": 500.0}, "validity": {"max_failed_requests": 10}}
    )
    analyze(exp, tmp_path / "out", opts, figures=False)
    doc: dict = json.loads((tmp_path / "out" / "slo.json").read_text())  # type: ignore[type-arg]
    return doc


def test_slo_json_decides_each_level_on_the_pooled_requests(tmp_path: Path) -> None:
    """c=1: 3 x 120 requests within the limit: meets. c=2: 3 x 64 within it: undecided (192 <
    299). c=4: 3 x 200, 5 failed in each: 15 of 600 over, fails. c=8: over the limit: fails.
    The capacity is c=1 though c=2 has more throughput: an undecided level never is."""
    doc = slo_of(
        tmp_path,
        [(r, 1, 100.0, 120, 0) for r in (1, 2, 3)]
        + [(r, 2, 100.0, 64, 0) for r in (1, 2, 3)]
        + [(r, 4, 100.0, 200, 5) for r in (1, 2, 3)]
        + [(r, 8, 900.0, 200, 0) for r in (1, 2, 3)],
    )
    assert doc["format_version"] == 2 and doc["min_requests"] == 299
    assert doc["allowed_over"] == 0.01 and doc["confidence"] == 0.95
    rows = {p["concurrency"]: p for p in doc["points"]}
    assert {c: (p["decision"], p["requests"], p["over"]) for c, p in rows.items()} == {
        1: ("meets", 360, 0),
        2: ("undecided", 192, 0),
        4: ("fails", 600, 15),
        8: ("fails", 600, 600),
    }
    assert rows[2]["decision_text"] == "undecided: 0 of 192 over (upper 1.5% > 1%; needs >= 299)"
    assert rows[1]["over_upper"] <= 0.01 < rows[4]["over_lower"]
    assert "meets_slo_every_repeat" not in rows[1]
    assert doc["capacity"]["a"] == {"concurrency": 1, "output_throughput": pytest.approx(100.0)}


def test_no_level_that_meets_says_how_many_were_undecided(tmp_path: Path) -> None:
    doc = slo_of(
        tmp_path,
        [(r, 1, 100.0, 32, 0) for r in (1, 2, 3)] + [(r, 2, 900.0, 64, 0) for r in (1, 2, 3)],
    )
    assert doc["capacity"]["a"] == {
        "concurrency": None,
        "output_throughput": None,
        "reason": "no level meets the SLO (1 failed, 1 undecided): a p99 SLO needs at least "
        "299 requests per level, all within the limits, to be met; the undecided levels had "
        "at most 96",
    }
    report = (tmp_path / "out" / "report.md").read_text()
    assert "undecided: 0 of 96 over (upper 3.1% > 1%; needs >= 299)" in report
    assert "A p99 SLO needs at least 299 requests per level" in report
