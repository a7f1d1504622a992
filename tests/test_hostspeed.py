"""The host's speed between two runs (servelab.analysis.hostspeed) and the false discovery
control over one comparison's tests (servelab.analysis.stats.benjamini_hochberg)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats as sps

from servelab.analysis.hostspeed import (
    AS_HOST,
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    UNCHANGED,
    attribute,
    host_ratio,
    host_speed,
    why_no_ratio,
)
from servelab.analysis.stats import Ratio, benjamini_hochberg, ratio_ci
from servelab.errors import ServelabError


def canary(compute_s: float, gbs: float, spread: float = 0.01) -> dict[str, Any]:
    """A CpuCanary.to_json() of a host whose fixed work takes `compute_s` seconds and whose
    copies run at `gbs` GB/s, each within +-`spread` (relative)."""

    def part(unit: str, m: float) -> dict[str, Any]:
        return {"unit": unit, "median": m, "low": m * (1 - spread), "high": m * (1 + spread)}

    return {
        "compute": part("s", compute_s) | {"repeats": 5},
        "bandwidth": part("GB/s", gbs) | {"repeats": 5},
        "checksum": 1234,
        "iterations": 1_000_000,
        "buffer_mib": 64,
    }


def run_doc(compute_s: float, gbs: float) -> dict[str, Any]:
    """A run.json with its canary before and after the sweep."""
    before, after = canary(compute_s, gbs), canary(compute_s, gbs)
    return {"format_version": 1, "canary": {"before": before, "after": after, "drift": {}}}


FAST = {"raw/a/run.json": run_doc(1.0, 10.0), "raw/b/run.json": run_doc(1.0, 10.0)}
SLOW = {"raw/a/run.json": run_doc(1.25, 8.0), "raw/b/run.json": run_doc(1.25, 8.0)}


# --- Benjamini-Hochberg ------------------------------------------------------------------


def test_bh_matches_a_hand_computed_example() -> None:
    """m = 5, sorted p = .001 .008 .039 .041 .042: m p / rank = .005 .02 .065 .05125 .042,
    then the running minimum from the top: .005 .02 .042 .042 .042."""
    p = [0.039, 0.001, 0.042, 0.008, 0.041]
    adjusted = benjamini_hochberg(p)
    assert adjusted == pytest.approx([0.042, 0.005, 0.042, 0.02, 0.042])
    # at q = 0.05 all five are discoveries; at q = 0.04 only the two smallest
    assert [a is not None and a <= 0.04 for a in adjusted] == [False, True, False, True, False]


def test_bh_leaves_untested_out_and_caps_at_one() -> None:
    adjusted = benjamini_hochberg([None, 0.9, 0.5, None])
    # m = 2: 0.9 -> min(2 * 0.9 / 2, 1) = 0.9; 0.5 -> min(2 * 0.5 / 1, 0.9) = 0.9
    assert adjusted == [None, pytest.approx(0.9), pytest.approx(0.9), None]
    assert benjamini_hochberg([0.8, 0.9, 0.95]) == pytest.approx([0.95, 0.95, 0.95])
    assert benjamini_hochberg([]) == []
    with pytest.raises(ValueError, match="between 0 and 1"):
        benjamini_hochberg([0.1], q=0.0)


def test_bh_agrees_with_scipy() -> None:
    rng = np.random.default_rng(7)
    p = list(np.concatenate([rng.uniform(0, 1, 40), rng.uniform(0, 0.002, 10)]))
    mine = benjamini_hochberg(p)
    assert mine == pytest.approx(list(sps.false_discovery_control(p, method="bh")))


def test_bh_is_stricter_than_the_tests_alone() -> None:
    """50 tests, one at p = 0.03: alone it is under 0.05, under BH (50 * 0.03 / 1 = 1.5, then
    the running minimum from the top, 50 * 0.5 / 50) it is 0.5, no discovery."""
    p = [0.03] + [0.5] * 49
    assert benjamini_hochberg(p)[0] == pytest.approx(0.5)


# --- ratio and its interval ----------------------------------------------------------------


def test_ratio_ci_is_welch_on_the_logs() -> None:
    a, b = [20.0, 21.0, 19.0], [10.0, 10.5, 9.5]
    r = ratio_ci(a, b)
    assert r is not None and r.low is not None and r.high is not None
    assert r.value == pytest.approx(2.0, rel=1e-3)
    # the log difference 0.6931 +- t(0.975, df = 4) * 0.0406 (Welch's df: equal variances)
    assert r.low == pytest.approx(1.7855, rel=1e-3) and r.high == pytest.approx(2.2403, rel=1e-3)
    assert ratio_ci([1.0], [2.0]) == Ratio(0.5, None, None)
    assert ratio_ci([0.0, 1.0], [1.0, 1.0]) is None


# --- the host's speed ------------------------------------------------------------------------


def test_host_speed_pools_every_canary_and_is_none_without() -> None:
    speed = host_speed(FAST)
    assert speed is not None and speed.canaries == 4
    assert speed.compute_s.median == pytest.approx(1.0)
    assert speed.compute_s.low == pytest.approx(0.99) and speed.compute_s.high == pytest.approx(
        1.01
    )
    assert host_speed({"raw/a/run.json": {"format_version": 1}}) is None
    assert why_no_ratio(None, speed) == (
        "host speed not recorded: the earlier run did not measure the canary"
    )
    assert why_no_ratio(None, None, ("v4", "v5")) == (
        "host speed not recorded: neither v4 nor v5 measured the canary"
    )


def test_a_damaged_canary_is_one_line_naming_the_file_and_key() -> None:
    doc = run_doc(1.0, 10.0)
    doc["canary"]["after"]["compute"]["median"] = "fast"
    with pytest.raises(ServelabError) as err:
        host_speed({"raw/a/run.json": doc})
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("raw/a/run.json: canary.after.compute.median: 'fast'")


def test_host_ratio_of_a_slowed_host() -> None:
    ratio = host_ratio(host_speed(FAST), host_speed(SLOW))
    assert ratio is not None and ratio.moved
    assert ratio.compute == pytest.approx(0.8) and ratio.bandwidth == pytest.approx(0.8)
    assert ratio.low < 0.8 < ratio.high and ratio.high < 0.85


def test_canaries_of_different_work_are_not_compared() -> None:
    other = {k: run_doc(1.0, 10.0) for k in FAST}
    for doc in other.values():
        for when in ("before", "after"):
            doc["canary"][when]["iterations"] = 2_000_000
    a, b = host_speed(FAST), host_speed(other)
    assert host_ratio(a, b) is None
    assert "different work" in str(why_no_ratio(a, b))


# --- attribution ---------------------------------------------------------------------------


def test_a_slowed_host_with_the_same_code_is_the_hosts_speed() -> None:
    """The host 20% slower, throughput 20% lower and latency 25% higher: as the host's speed,
    never beyond it."""
    host = host_ratio(host_speed(FAST), host_speed(SLOW))
    tput = ratio_ci([80.0, 81.0, 79.0], [100.0, 101.0, 99.0])
    lat = ratio_ci([125.0, 126.0, 124.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", tput, True, host, 5.0)
    assert a.answer == AS_HOST and a.direction is None
    assert a.vs_host == pytest.approx(1.0, abs=0.01)
    b = attribute("mean_tpot_ms", lat, True, host, 5.0)
    assert b.answer == AS_HOST and b.speed == pytest.approx(0.8, rel=0.01)


def test_a_real_change_on_an_equal_host_is_beyond_the_host() -> None:
    host = host_ratio(host_speed(FAST), host_speed(FAST))
    assert host is not None and not host.moved
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, host, 5.0)
    assert a.answer == BEYOND_HOST and a.direction == "better"
    assert a.vs_host == pytest.approx(2.0, rel=0.01)
    # a latency twice as long is beyond the host too, and worse
    b = attribute("p99_ttft_ms", twice, True, host, 5.0)
    assert b.answer == BEYOND_HOST and b.direction == "worse"


def test_a_slower_host_does_not_explain_an_even_slower_code() -> None:
    """The host 20% slower, the throughput halved: beyond the host, worse."""
    host = host_ratio(host_speed(FAST), host_speed(SLOW))
    half = ratio_ci([50.0, 51.0, 49.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", half, True, host, 5.0)
    assert a.answer == BEYOND_HOST and a.direction == "worse"


def test_without_a_canary_a_change_is_not_attributed() -> None:
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, None, 5.0)
    assert a.answer == HOST_NOT_RECORDED and a.direction is None and a.vs_host is None
    assert attribute("output_throughput", twice, False, None, 5.0).answer == UNCHANGED


# --- what a failed reproduction on an equivalent host says of the code ---------------------

EQUIVALENT = {"class": "equivalent"}
STEADY = {"recorded": True, "why_not": None, "ratio": 1.0, "moved": False}
SLOWER = {"recorded": True, "why_not": None, "ratio": 0.8, "moved": True}


def failed_point(answer: str, direction: str | None = None) -> dict[str, Any]:
    return {"verdict": "NOT REPRODUCED", "host_attribution": answer, "direction": direction}


ORDERING = {"verdict": "NOT REPRODUCED", "judged": True}


@pytest.mark.parametrize(
    ("speed", "failed", "ends"),
    [
        (STEADY, [ORDERING], ": a regression"),
        (SLOWER, [ORDERING], "(the host's speed, x0.8 of the reference's, explains every failure)"),
        (
            SLOWER,
            [ORDERING, failed_point(BEYOND_HOST, "worse")],
            ": a regression beyond what the host's speed (x0.8 of the reference's) explains",
        ),
        (
            SLOWER,
            [failed_point(BEYOND_HOST, "better")],
            ": faster beyond what the host's speed (x0.8 of the reference's) explains, not a "
            "regression",
        ),
        (
            STEADY,
            [failed_point(UNCHANGED)],
            "(no failed check is a real change beyond the host's speed, x1 of the reference's)",
        ),
        (
            {"recorded": False, "why_not": "host speed not recorded: the fresh run did not"},
            [failed_point(HOST_NOT_RECORDED)],
            ": not attributed to the code (host speed not recorded: the fresh run did not)",
        ),
    ],
)
def test_a_failure_is_a_regression_only_where_the_host_explains_none_of_it(
    speed: dict[str, Any], failed: list[dict[str, Any]], ends: str
) -> None:
    from servelab.reproduce.comparison import _attributed

    text = _attributed("NOT REPRODUCED", EQUIVALENT, speed, failed)
    assert text.endswith(ends), text
    assert ("regression" in text) == ("a regression" in ends)
    # never on a differing host, nor for another verdict
    assert _attributed("NOT REPRODUCED", {"class": "differs"}, speed, failed) == ""
    assert _attributed("REPRODUCED", EQUIVALENT, speed, []) == ""
