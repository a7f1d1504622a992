from __future__ import annotations

import itertools
import json
from collections.abc import Callable

from servelab.hostfacts import canary


def fake_timer(step: float) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: next(ticks) * step


def test_fields_and_units() -> None:
    result = canary.measure_cpu(iterations=1000, buffer_mib=1, repeats=3)
    assert result.compute.unit == "s" and result.bandwidth.unit == "GB/s"
    assert result.compute.repeats == 3 and result.bandwidth.repeats == 3
    assert result.compute.low <= result.compute.median <= result.compute.high
    assert result.bandwidth.median > 0
    data = result.to_json()
    assert set(data) == {"compute", "bandwidth", "checksum", "iterations", "buffer_mib", "workers"}


def test_work_is_deterministic() -> None:
    first = canary.measure_cpu(iterations=2000, buffer_mib=1, repeats=2)
    second = canary.measure_cpu(iterations=2000, buffer_mib=1, repeats=2)
    assert first.checksum == second.checksum == canary.compute_work(2000)
    assert canary.compute_work(2000) != canary.compute_work(2001)


def test_drift_steady_back_to_back() -> None:
    before = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    after = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    result = canary.drift(before, after)
    assert result.verdict == "steady"
    assert result.compute.change == 0.0 and result.compute.threshold == canary.DRIFT_FLOOR


def test_drift_moved_on_30_percent_slowdown() -> None:
    before = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.01))
    after = canary.measure_cpu(iterations=100, buffer_mib=1, timer=fake_timer(0.013))
    result = canary.drift(before, after)
    assert result.verdict == "moved"
    assert abs(result.compute.change - 0.3) < 1e-9
    assert abs(result.bandwidth.change - 0.3) < 1e-9


def timed(compute_s: float, copy_gbps: float) -> canary.CpuCanary:
    """A canary as measured: five repeats within 1% of the medians."""

    def t(unit: str, m: float) -> canary.Timing:
        return canary.Timing(unit, m, m * 0.995, m * 1.005, 5)

    return canary.CpuCanary(t("s", compute_s), t("GB/s", copy_gbps), 7, 300_000, 64)


def test_the_run_record_round_trips_through_json() -> None:
    record = canary.RunCanary(
        timed(0.085, 5.0), timed(0.086, 4.9), canary.drift(timed(0.085, 5.0), timed(0.086, 4.9))
    )
    doc = json.loads(json.dumps(record.to_json()))
    assert canary.RunCanary.from_json(doc) == record
    assert set(doc) == {"before", "after", "drift"} and doc["drift"]["verdict"] == "steady"


def test_a_job_times_it_before_its_first_launch_and_after_its_last() -> None:
    """Three launches (a sequential sweep's rounds): before is the first's, after the last's;
    a job that launched nothing records none."""
    taken = iter([timed(0.085, 5.0), timed(0.09, 5.0), timed(0.1, 5.0), timed(0.12, 4.0)])
    times = canary.CanaryTimes(measure=lambda: next(taken))
    assert times.record() is None
    assert times.before_launch() is not None
    times.after_launch()
    assert times.before_launch() is None  # not timed again before a later launch
    times.after_launch()
    times.after_launch()
    record = times.record()
    assert record is not None
    assert record.before.compute.median == 0.085 and record.after.compute.median == 0.12
    assert record.drift.verdict == "moved" and record.drift.compute.change > 0.4


def test_validity_notes_a_sweep_whose_host_slowed_and_passes_a_steady_one() -> None:
    from servelab.analysis.validity import host_speed_json

    steady = canary.RunCanary(
        timed(0.085, 5.0), timed(0.086, 5.0), canary.drift(timed(0.085, 5.0), timed(0.086, 5.0))
    )
    slowed = canary.RunCanary(
        timed(0.085, 5.0), timed(0.17, 2.5), canary.drift(timed(0.085, 5.0), timed(0.17, 2.5))
    )
    out = host_speed_json({"b": slowed, "a": steady})
    assert list(out) == ["a", "b"]
    assert out["a"]["status"] == "passed" and out["a"]["reason"].startswith("host speed steady")
    assert out["b"]["status"] == "noted"
    assert out["b"]["reason"].startswith("the host changed speed during the sweep: moved")
    assert out["b"]["after"] == {"compute_s": 0.17, "copy_gbps": 2.5}


def test_a_timing_that_spread_too_wide_is_unsteady_unless_the_change_is_larger_still() -> None:
    """A host whose speed varied within one timing (repeats 30% apart) cannot be called
    steady; a change beyond even that noise is still called moved."""
    wobbly = canary.CpuCanary(
        canary.Timing("s", 0.085, 0.07, 0.10, 5), timed(0.085, 5.0).bandwidth, 7, 300_000, 64
    )
    unsteady = canary.drift(timed(0.085, 5.0), wobbly)
    assert unsteady.compute.verdict == "unsteady" and unsteady.verdict == "unsteady"
    assert "compute varied by more than 25% within a timing" in unsteady.line()
    halved = canary.CpuCanary(
        canary.Timing("s", 0.2, 0.17, 0.23, 5), timed(0.085, 5.0).bandwidth, 7, 300_000, 64
    )
    assert canary.drift(timed(0.085, 5.0), halved).verdict == "moved"


def test_the_compute_part_runs_on_every_available_cpu_with_the_same_loop() -> None:
    """Its workers run compute_work's loop (the same checksum as in this process), one per CPU
    this process may use; the record says how many."""
    two = canary.measure_cpu(iterations=5000, buffer_mib=1, repeats=2, workers=2)
    one = canary.measure_cpu(iterations=5000, buffer_mib=1, repeats=2, workers=1)
    assert two.checksum == one.checksum == canary.compute_work(5000)
    assert (two.workers, one.workers) == (2, 1)
    assert canary.measure_cpu(iterations=100, buffer_mib=1, repeats=1).workers == (
        canary.workers_available()
    )
    assert canary.CpuCanary.from_json(two.to_json()) == two
