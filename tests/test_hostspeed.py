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
    UNKNOWN,
    Gate,
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


def run_doc(
    compute_s: float, gbs: float, spread: float = 0.01, verdict: str = "steady"
) -> dict[str, Any]:
    """A run.json with its canary before and after the sweep, and its drift verdict."""
    before, after = canary(compute_s, gbs, spread), canary(compute_s, gbs, spread)
    drift = {"verdict": verdict}
    return {"format_version": 1, "canary": {"before": before, "after": after, "drift": drift}}


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


NO_SPREAD = Gate(run_spread_pct=0.0)  # no run-to-run allowance: the canary's and repeats' own


def test_a_slowed_host_with_the_same_code_is_the_hosts_speed() -> None:
    """The host 20% slower, throughput 20% lower and latency 25% higher: the host-adjusted
    interval lies inside the 10% margin: as the host's speed, never beyond it."""
    host = host_ratio(host_speed(FAST), host_speed(SLOW))
    tput = ratio_ci([80.0, 80.2, 79.8], [100.0, 100.2, 99.8])
    lat = ratio_ci([125.0, 125.2, 124.8], [100.0, 100.2, 99.8])
    a = attribute("output_throughput", tput, True, host, NO_SPREAD)
    assert a.answer == AS_HOST and a.direction is None
    assert a.vs_host == pytest.approx(1.0, abs=0.01)
    assert a.adjusted is not None and 1 / 1.1 < a.adjusted[0] < a.adjusted[1] < 1.1
    b = attribute("mean_tpot_ms", lat, True, host, NO_SPREAD)
    assert b.answer == AS_HOST and b.speed == pytest.approx(0.8, rel=0.01)


def test_the_run_to_run_allowance_leaves_one_pair_of_runs_unknown() -> None:
    """With the default allowance for how far two runs stray (5%), three repeats a side
    cannot show a change within the margin: UNKNOWN, naming the rerun that settles it."""
    host = host_ratio(host_speed(FAST), host_speed(SLOW))
    tput = ratio_ci([80.0, 80.2, 79.8], [100.0, 100.2, 99.8])
    gate = Gate(rerun="servelab rerun evidence/x/v4 evidence/x/v5")
    a = attribute("output_throughput", tput, True, host, gate)
    assert a.answer == UNKNOWN and a.direction is None
    assert a.why is not None and a.why.endswith(
        "is neither inside nor outside the 10% margin; compare both on one host: "
        "`servelab rerun evidence/x/v4 evidence/x/v5`"
    )


def test_a_real_change_on_an_equal_host_is_beyond_the_host() -> None:
    host = host_ratio(host_speed(FAST), host_speed(FAST))
    assert host is not None and not host.moved
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, host)
    assert a.answer == BEYOND_HOST and a.direction == "better"
    assert a.vs_host == pytest.approx(2.0, rel=0.01)
    # a latency twice as long is beyond the host too, and worse
    b = attribute("p99_ttft_ms", twice, True, host)
    assert b.answer == BEYOND_HOST and b.direction == "worse"


def test_a_slower_host_does_not_explain_an_even_slower_code() -> None:
    """The host 20% slower, the throughput halved: beyond the host, worse."""
    host = host_ratio(host_speed(FAST), host_speed(SLOW))
    half = ratio_ci([50.0, 51.0, 49.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", half, True, host)
    assert a.answer == BEYOND_HOST and a.direction == "worse"


def test_a_wide_canary_excuses_nothing() -> None:
    """An identical host whose canary repeats spread 25% either side: the old band's hull called
    a 25% throughput drop (p = 0.002) the host's. Its drift is unsteady (hostfacts.timing), so
    the canary cannot tell: UNKNOWN, never "as the host's speed"."""
    noisy = {k: run_doc(1.0, 10.0, 0.25, "unsteady") for k in FAST}
    host = host_ratio(host_speed(FAST), host_speed(noisy))
    drop = ratio_ci([75.0, 75.5, 74.5], [100.0, 100.5, 99.5])
    a = attribute("output_throughput", drop, True, host)
    assert a.answer == UNKNOWN and a.why is not None
    assert a.why.startswith("the canary's drift was unsteady in the later run")
    assert a.why.endswith("`servelab rerun REFERENCE_BUNDLE CURRENT_BUNDLE`")


def test_a_host_ratio_wider_than_twice_the_margin_cannot_tell() -> None:
    """A steady canary whose timings before and after the sweep differ by 25% (within what its
    drift calls steady at a 10% spread): the bootstrap over the timings gives an interval wider
    than (1.1)^2, and a real doubling is UNKNOWN, not beyond."""
    doc = run_doc(1.0, 10.0, 0.1)
    doc["canary"]["after"] = canary(1.25, 8.0, 0.1)
    host = host_ratio(host_speed(FAST), host_speed({"raw/a/run.json": doc}))
    assert host is not None and host.high / host.low > 1.1**2
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, host)
    assert a.answer == UNKNOWN and a.why is not None
    assert "wider than twice the 10% margin" in a.why


@pytest.mark.parametrize("verdict", ["moved", "unsteady"])
def test_a_canary_that_moved_or_was_unsteady_cannot_tell(verdict: str) -> None:
    later = {k: run_doc(1.0, 10.0, verdict=verdict) for k in FAST}
    host = host_ratio(host_speed(FAST), host_speed(later))
    assert host is not None and (host.drift, host.drift_in) == (verdict, ("after",))
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    gate = Gate(names=("the reference", "the fresh run"))
    a = attribute("output_throughput", twice, True, host, gate)
    assert a.answer == UNKNOWN and a.why is not None
    assert a.why.startswith(f"the canary's drift was {verdict} in the fresh run")


def test_a_misread_canary_cannot_flip_a_regression_into_an_improvement() -> None:
    """Busy loops beside a server that does not use every core: the canary reads the host at
    0.56 while the server is not slowed. A real 20% regression over that ratio reads 1.43:
    the canary alone would turn it into an improvement, so it is UNKNOWN, not "better"."""
    misread = {k: run_doc(1.0 / 0.56, 5.6) for k in FAST}
    host = host_ratio(host_speed(FAST), host_speed(misread))
    assert host is not None and host.ratio == pytest.approx(0.56, rel=0.01)
    worse = ratio_ci([80.0, 80.5, 79.5], [100.0, 100.5, 99.5])
    assert attribute("output_throughput", worse, True, host).answer == UNKNOWN
    # even with no run-to-run allowance, where s / h lies wholly outside the margin
    a = attribute("output_throughput", worse, True, host, NO_SPREAD)
    assert a.answer == UNKNOWN and a.direction is None
    assert a.why is not None and a.why.startswith(
        "the host ratio alone, 0.56, would turn a change for the worse into one for the better"
    )


def test_without_a_canary_a_change_is_not_attributed() -> None:
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, None)
    assert a.answer == HOST_NOT_RECORDED and a.direction is None and a.vs_host is None
    assert attribute("output_throughput", twice, False, None).answer == UNCHANGED


# --- the host ratio's interval -------------------------------------------------------------


def test_the_interval_is_a_deterministic_bootstrap_over_the_timings() -> None:
    """Same canaries, same interval to the byte; kept repeats (`timings`) are read in place of
    (low, median, high), and more spread repeats give a wider interval."""
    one, again = (
        host_ratio(host_speed(FAST), host_speed(SLOW)),
        host_ratio(host_speed(FAST), host_speed(SLOW)),
    )
    assert one is not None and one == again
    wide = {k: run_doc(1.0, 10.0) for k in FAST}
    for doc in wide.values():
        part = doc["canary"]["after"]["compute"]
        part["timings"] = [0.8, 1.0, 1.25]  # kept: wider than its low and high say
    narrow = host_ratio(host_speed(FAST), host_speed(FAST))
    widened = host_ratio(host_speed(FAST), host_speed(wide))
    assert narrow is not None and widened is not None
    assert widened.high / widened.low > 2 * (narrow.high / narrow.low) - 1
    assert narrow.low <= 1.0 <= narrow.high


def test_gpu_hosts_read_the_cpu_canary_too() -> None:
    """A GPU runtime's ratio is the GPU canary's; where the CPU canary's interval is not inside
    the margin, the host's CPU side changed: UNKNOWN."""
    from dataclasses import replace

    host = host_ratio(host_speed(FAST), host_speed(FAST))
    assert host is not None
    gpu = replace(host, parts="gpu", cpu=(0.7, 0.65, 0.75))
    twice = ratio_ci([200.0, 202.0, 198.0], [100.0, 101.0, 99.0])
    a = attribute("output_throughput", twice, True, gpu)
    assert a.answer == UNKNOWN and a.why is not None
    assert a.why.startswith("the host's CPU side changed: the CPU canary's ratio, 0.65 to 0.75")
    steady = replace(host, parts="gpu", cpu=(1.0, 0.98, 1.02))
    assert attribute("output_throughput", twice, True, steady).answer == BEYOND_HOST


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
