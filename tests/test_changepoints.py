"""Change points over a history of releases (servelab.analysis.changepoints): the step fit on
hand-made series, its rates on seeded simulated histories (the numbers docs/analysis.md,
"Change points over a history", quotes), the between-release variance, excursions, and the
canary's part (a gate, never a rescaler)."""

from __future__ import annotations

import math
import random
import time

import pytest

from servelab.analysis.changepoints import (
    CHANGED,
    EXCURSION,
    NO_CHANGE,
    NOT_POSITIVE,
    PENALTY,
    STEP,
    TOO_FEW,
    TOO_FEW_REPEATS,
    Releases,
    change_points,
    step_fit,
)
from servelab.analysis.hostspeed import (
    ANSWERS,
    AS_HOST,
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    UNKNOWN,
    HostSpeed,
    Span,
)

THRESHOLD_PCT = 2.0


def history(
    rng: random.Random,
    levels: list[float],
    cv: float = 0.05,
    repeats: int = 3,
    between: float = 0.0,
) -> list[list[float]]:
    """A simulated history: per release, `repeats` values around its level, log-normal with a
    spread of `cv` (the committed quickstart-cpu points spread 3 to 13%, median about 6%), the
    level itself moved by a log-normal factor of spread `between` (release-to-release noise)."""
    out = []
    for lv in levels:
        level = lv * math.exp(rng.gauss(0.0, between))
        out.append([level * math.exp(rng.gauss(0.0, cv)) for _ in range(repeats)])
    return out


def rate(
    levels: list[float], cv: float, trials: int, seed: int, between: float = 0.0
) -> tuple[float, float]:
    """Over `trials` seeded histories of `levels`: the share with any change point, and the
    share whose change points are exactly the releases where `levels` steps (the numbers of
    docs/analysis.md, "Change points over a history", are this with 2000 trials)."""
    rng = random.Random(seed)
    steps = [i for i in range(1, len(levels)) if levels[i] != levels[i - 1]]
    fits = [step_fit(history(rng, levels, cv, 3, between), THRESHOLD_PCT) for _ in range(trials)]
    changed = sum(f.answer == CHANGED for f in fits) / trials
    exact = sum([s.at for s in f.steps] == steps for f in fits) / trials
    return changed, exact


def speed(compute_s: float, bandwidth_gbs: float) -> HostSpeed:
    """A host speed from one canary, its spread 1% either side."""
    return HostSpeed(
        Span(compute_s, 0.99 * compute_s, 1.01 * compute_s),
        Span(bandwidth_gbs, 0.99 * bandwidth_gbs, 1.01 * bandwidth_gbs),
        2,
        (1, 600_000, 64),
    )


def test_a_clear_step_is_found_at_its_release() -> None:
    values = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.0, 100.0, 101.0]]
    values += [[60.0, 61.0, 59.5], [60.5, 59.0, 60.0], [61.0, 60.0, 59.5]]
    fit = step_fit(values, THRESHOLD_PCT)
    assert fit.answer == CHANGED
    (step,) = fit.steps
    assert step.at == 3  # the first release of the new level
    assert step.ratio == pytest.approx(0.6, rel=0.01)
    assert step.z < -40  # far beyond the 4 standard errors the penalty asks
    assert fit.levels == pytest.approx((100.0, 60.0), rel=0.01)


def test_a_flat_series_has_no_change_point() -> None:
    values = [[100.0, 103.0, 97.0], [101.0, 99.0, 98.0], [99.5, 102.0, 100.0], [98.0, 101.0, 100.0]]
    fit = step_fit(values, THRESHOLD_PCT)
    assert (fit.answer, fit.steps) == (NO_CHANGE, ())
    assert len(fit.levels) == 1


def test_two_steps_and_a_return() -> None:
    """A level that dropped and came back: both steps, in order."""
    values = [[100.0, 100.5, 99.5]] * 3 + [[70.0, 70.5, 69.5]] * 3 + [[100.0, 101.0, 99.0]] * 3
    fit = step_fit(values, THRESHOLD_PCT)
    assert [s.at for s in fit.steps] == [3, 6]
    assert fit.steps[0].ratio < 1.0 < fit.steps[1].ratio


def test_a_step_below_the_practical_threshold_is_no_change_point() -> None:
    """Repeats that agree to 0.01% make a 1% step stand many standard errors clear (the
    spread's floor keeps it finite), but it does not reach a 2% threshold."""
    values = [[100.0, 100.0, 100.01]] * 3 + [[101.0, 101.0, 101.01]] * 3
    assert [s.at for s in step_fit(values, 0.5).steps] == [3]
    assert step_fit(values, THRESHOLD_PCT).answer == NO_CHANGE


def test_why_there_is_no_fit() -> None:
    assert step_fit([[1.0, 1.1], [2.0, 2.1]], THRESHOLD_PCT).answer == TOO_FEW
    # a release without a valid repeat does not count
    assert step_fit([[1.0, 1.1], [], [2.0, 2.1]], THRESHOLD_PCT).answer == TOO_FEW
    assert step_fit([[1.0], [1.1], [5.0]], THRESHOLD_PCT).answer == TOO_FEW_REPEATS
    assert step_fit([[1.0, 1.1], [0.0, 1.0], [2.0, 2.1]], THRESHOLD_PCT).answer == NOT_POSITIVE


def test_the_fit_is_deterministic_and_scale_free() -> None:
    """Same values, same fit; a series in other units (x 1000) has the same steps."""
    values = history(random.Random(7), [100.0] * 3 + [80.0] * 3)
    one, again = step_fit(values, THRESHOLD_PCT), step_fit([list(v) for v in values], 2.0)
    assert one == again
    scaled = step_fit([[1000.0 * x for x in v] for v in values], THRESHOLD_PCT)
    assert [s.at for s in scaled.steps] == [s.at for s in one.steps] == [3]


def test_false_change_points_on_flat_histories_are_rare() -> None:
    """200 seeded flat histories (6 releases of 3 repeats, 5% spread): at most 2% show a
    change point (the simulation behind docs/analysis.md gives about 1% for 3 to 12 releases;
    the pooled spread makes the rate the same at any spread)."""
    started = time.perf_counter()
    false, _ = rate([100.0] * 6, 0.05, 200, 6)
    assert false <= 0.02, f"{false:.1%} of 200 flat histories show a change point"
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(("cv", "least"), [(0.05, 196), (0.10, 96)])
def test_a_30_percent_step_is_found(cv: float, least: int) -> None:
    """200 seeded histories with a 30% drop after the third of 6 releases: found at that
    release, and nowhere else, in at least 98% of them at a 5% spread (48% at 10%: with the
    between-release variance estimated from 6 releases, a step must stand clear of their
    scatter too; docs/analysis.md gives the rates)."""
    _, found = rate([100.0] * 3 + [70.0] * 3, cv, 200, 6)
    assert found >= least / 200, f"found in {found:.1%} of 200"


@pytest.mark.parametrize("between", [0.05, 0.10])
def test_release_to_release_noise_makes_few_false_change_points(between: float) -> None:
    """Flat histories of 6 releases whose levels stray 5% (10%) from release to release: the
    within-release variance alone called a change point in about a quarter of them; with the
    between-release variance estimated, at most 5%."""
    false, _ = rate([100.0] * 6, 0.05, 200, 11, between)
    assert false <= 0.05, f"{false:.1%} of 200 flat histories show a change point"


def test_the_between_release_variance_is_estimated() -> None:
    """Releases that stray 10% while their repeats agree within 1%: tau is found near 10%,
    and no step is called; the same releases with their repeats alone would be steps."""
    values = [[lv, lv * 1.01, lv * 0.99] for lv in (100.0, 112.0, 95.0, 104.0, 90.0, 101.0)]
    fit = step_fit(values, THRESHOLD_PCT)
    assert fit.answer == NO_CHANGE
    assert 0.05 < math.sqrt(fit.tau2) < 0.15


def test_a_single_slow_release_is_one_excursion() -> None:
    """A release 30% down between flat ones: one excursion at that release, not two level
    changes."""
    flat = [[100.0, 101.0, 99.0]] * 3
    values = flat + [[70.0, 70.5, 69.5]] + flat
    got = change_points("output_throughput", values, [None] * 7, THRESHOLD_PCT)
    (point,) = got.points
    assert (point.at, point.kind, point.answer) == (3, EXCURSION, HOST_NOT_RECORDED)
    assert point.change_pct == pytest.approx(-30.0, abs=0.5)
    # down and not back: a step, and another one later is a step too
    lower = flat + [[70.0, 70.5, 69.5]] * 4
    assert [
        (p.at, p.kind) for p in change_points("output_throughput", lower, [None] * 7, 2.0).points
    ] == [(3, STEP)]


def test_without_a_canary_a_change_point_is_not_attributed() -> None:
    values = [[100.0, 101.0, 99.0]] * 3 + [[70.0, 71.0, 69.0]] * 3
    got = change_points("output_throughput", values, [None] * 6, THRESHOLD_PCT)
    assert got.answer == CHANGED
    (point,) = got.points
    assert (point.at, point.answer, point.direction) == (3, HOST_NOT_RECORDED, None)
    assert point.change_pct == pytest.approx(-30.0, abs=0.5)
    assert point.vs_host_pct is None
    # either release beside the step without its canary is enough
    hosts = [speed(1.0, 10.0)] * 3 + [None] * 3
    assert change_points("output_throughput", values, hosts, 2.0).points[0].answer == (
        HOST_NOT_RECORDED
    )
    assert {p.answer for p in got.points} <= set(ANSWERS)


def test_a_step_of_the_hosts_speed_is_the_hosts() -> None:
    """Throughput down 30% on a host 30% slower (the canary's compute seconds up and its copy
    bandwidth down by 1 / 0.7): the step over the host ratio lies inside the margin."""
    values = [[100.0, 101.0, 99.0]] * 3 + [[70.0, 71.0, 69.0]] * 3
    hosts = [speed(1.0, 10.0)] * 3 + [speed(1.0 / 0.7, 7.0)] * 3
    got = change_points("output_throughput", values, hosts, THRESHOLD_PCT)
    (point,) = got.points
    assert (point.at, point.answer, point.direction) == (3, AS_HOST, None)
    assert abs(point.vs_host_pct or 0.0) < 1.0
    # a latency on that host: up by 1 / 0.7, the host's too
    latency = [[10.0, 10.1, 9.9]] * 3 + [[10.0 / 0.7, 10.1 / 0.7, 9.9 / 0.7]] * 3
    assert change_points("mean_tpot_ms", latency, hosts, 2.0).points[0].answer == AS_HOST


def test_a_step_beyond_the_hosts_speed_is_the_codes() -> None:
    """Throughput down 30% on a host as fast: beyond the host, worse; a latency down 30%:
    better."""
    values = [[100.0, 101.0, 99.0]] * 3 + [[70.0, 71.0, 69.0]] * 3
    same = [speed(1.0, 10.0)] * 6
    (point,) = change_points("output_throughput", values, same, THRESHOLD_PCT).points
    assert (point.answer, point.direction) == (BEYOND_HOST, "worse")
    assert point.vs_host_pct == pytest.approx(point.change_pct, abs=0.5)
    latency = [[10.0, 10.1, 9.9]] * 3 + [[7.0, 7.1, 6.9]] * 3
    assert change_points("mean_ttft_ms", latency, same, 2.0).points[0].direction == "better"


def test_the_canary_never_rescales_a_series() -> None:
    """Flat throughput on a host the canary reads 40% faster from the 4th release: the series
    is not divided by the canary, so no change point appears; and a canary that reads every
    release differently makes none either (the old rescaling made the same false step in every
    series at once)."""
    flat = [[100.0, 101.0, 99.0]] * 6
    faster = [speed(1.0, 10.0)] * 3 + [speed(1.0 / 1.4, 14.0)] * 3
    got = change_points("output_throughput", flat, faster, THRESHOLD_PCT)
    assert (got.answer, got.points) == (NO_CHANGE, ())


def test_a_change_point_the_canary_cannot_judge_is_unknown_with_the_rerun() -> None:
    """A 30% drop where the canary of the releases either side spread too wide: UNKNOWN, with
    the rerun of those two releases' folders."""
    values = [[100.0, 101.0, 99.0]] * 3 + [[70.0, 71.0, 69.0]] * 3
    wide = HostSpeed(Span(1.0, 0.6, 1.6), Span(10.0, 6.0, 16.0), 2, (1, 600_000, 64))
    hosts = [speed(1.0, 10.0)] * 2 + [wide, wide] + [speed(1.0, 10.0)] * 2
    paths = [f"evidence/x/v{i + 1}" for i in range(6)]
    got = change_points("output_throughput", values, Releases(hosts, paths), THRESHOLD_PCT)
    (point,) = got.points
    assert point.answer == UNKNOWN and point.why is not None
    assert point.why.endswith("`servelab rerun evidence/x/v3 evidence/x/v4`")


def test_no_change_point_and_too_few_releases_with_a_canary() -> None:
    flat = [[100.0, 101.0, 99.0]] * 4
    got = change_points("output_throughput", flat, [speed(1.0, 10.0)] * 4, THRESHOLD_PCT)
    assert (got.answer, got.points) == (NO_CHANGE, ())
    short = change_points("output_throughput", flat[:2], [None, None], THRESHOLD_PCT)
    assert (short.answer, short.points) == (TOO_FEW, ())


def test_the_penalty_is_four_standard_errors() -> None:
    assert math.sqrt(PENALTY) == 4.0
