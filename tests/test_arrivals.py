"""Arrival schedules: drawn from the seed alone, at the rate and burstiness asked for, and of
the distribution they claim (a goodness-of-fit test that a wrong distribution fails)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from servelab.design.arrivals import KINDS, ArrivalProcess
from servelab.errors import ServelabError

RATE = 4.0


def gaps_s(p: ArrivalProcess, n: int) -> np.ndarray:
    """The n gaps of a schedule of n + 1 requests, in seconds."""
    return np.diff(p.schedule_ns(n + 1)) / 1e9


@pytest.mark.parametrize(("kind", "b"), [("poisson", 1.0), ("gamma", 0.25), ("gamma", 3.0)])
def test_same_seed_same_schedule_other_seed_another(kind: str, b: float) -> None:
    a = ArrivalProcess(kind, RATE, b, seed=7).schedule_ns(1000)
    again = ArrivalProcess(kind, RATE, b, seed=7).schedule_ns(1000)
    other = ArrivalProcess(kind, RATE, b, seed=8).schedule_ns(1000)
    assert a.dtype == np.int64 and a.tobytes() == again.tobytes()
    assert a.tobytes() != other.tobytes()
    # the first requests of a longer schedule are the shorter one's
    assert ArrivalProcess(kind, RATE, b, seed=7).schedule_ns(10).tolist() == a[:10].tolist()


def test_the_schedule_is_pinned_byte_for_byte() -> None:
    """The schedule is part of the raw data: these integers are what every host draws."""
    s = ArrivalProcess("poisson", RATE, seed=12345).schedule_ns(10000)
    assert s[:6].tolist() == [0, 46033142, 207289909, 1379844582, 1484484249, 1612246110]
    digest = hashlib.sha256(s.astype("<i8").tobytes()).hexdigest()
    assert digest == "471465acf5b7faf92331ae6fb07fe335a17b85b0b5aa0d8ecbc54f348859b2b0"
    g = ArrivalProcess("gamma", RATE, 0.25, seed=12345).schedule_ns(10000)
    digest = hashlib.sha256(g.astype("<i8").tobytes()).hexdigest()
    assert digest == "9f0ba89161054514d44dafd0885e1a2965df7674fe74dd1aa13754cf1ac0e245"


def test_poisson_is_gamma_with_burstiness_one() -> None:
    p = ArrivalProcess("poisson", RATE, seed=3).schedule_ns(2000)
    g = ArrivalProcess("gamma", RATE, 1.0, seed=3).schedule_ns(2000)
    assert p.tobytes() == g.tobytes()


def test_constant_is_exact_and_ignores_the_seed() -> None:
    s = ArrivalProcess("constant", 3.0).schedule_ns(7)
    assert s.tolist() == [0, 333333333, 666666667, 1000000000, 1333333333, 1666666667, 2000000000]
    assert ArrivalProcess("constant", 3.0, seed=9).schedule_ns(7).tolist() == s.tolist()


@pytest.mark.parametrize(("kind", "b"), [("poisson", 1.0), ("gamma", 0.25), ("gamma", 4.0)])
def test_rate_and_burstiness_are_honoured(kind: str, b: float) -> None:
    """Mean gap 1/rate within 4 standard errors; squared coefficient of variation 1/B."""
    n = 40000
    g = gaps_s(ArrivalProcess(kind, RATE, b, seed=11), n)
    sd = (1 / RATE) / np.sqrt(b)  # a gamma gap's: sqrt(B) * scale, scale = 1 / (rate B)
    assert abs(g.mean() - 1 / RATE) < 4 * sd / np.sqrt(n)
    assert g.var() / g.mean() ** 2 == pytest.approx(1 / b, rel=0.1)
    assert (g >= 0).all()


def ks_exponential(p: ArrivalProcess, n: int = 5000) -> float:
    """Kolmogorov-Smirnov p-value of n gaps of `p` against the exponential with mean 1/RATE."""
    return float(stats.kstest(gaps_s(p, n), "expon", args=(0, 1 / RATE)).pvalue)


def test_poisson_passes_an_exponential_fit_and_bursty_gamma_fails_it() -> None:
    """Kolmogorov-Smirnov on 5000 gaps against the exponential with the schedule's rate:
    Poisson arrivals pass (p = 0.93 at this seed); gamma arrivals with burstiness 0.25 at the
    same rate fail (p below the smallest float), and so do Poisson arrivals at 0.9 of the rate
    (p = 1.4e-8)."""
    assert ks_exponential(ArrivalProcess("poisson", RATE, seed=1)) > 0.05
    assert ks_exponential(ArrivalProcess("gamma", RATE, 0.25, seed=1)) < 1e-6
    assert ks_exponential(ArrivalProcess("poisson", RATE * 0.9, seed=1)) < 1e-3


def test_schedules_of_no_and_one_request() -> None:
    for kind in KINDS:
        p = ArrivalProcess(kind, RATE, 0.5 if kind == "gamma" else 1.0)
        assert p.schedule_ns(0).tolist() == []
        assert p.schedule_ns(1).tolist() == [0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("posson", 1.0), ["'posson'", "poisson, gamma, constant"]),
        (("poisson", 0), ["rate 0", "requests per second"]),
        (("poisson", float("nan")), ["rate nan", "above 0"]),
        (("poisson", "2"), ["rate '2'", "above 0"]),
        (("gamma", 1.0, -1.0), ["burstiness -1.0", "below 1: burstier"]),
        (("gamma", 1.0, float("inf")), ["burstiness inf", "gamma shape"]),
        (("poisson", 1.0, 0.5), ["burstiness 0.5", "gamma arrivals only", "kind to gamma"]),
        (("constant", 1.0, 2.0), ["burstiness 2.0", "leave burstiness at 1 for constant"]),
        (("poisson", 1.0, 1.0, -3), ["seed -3", "from 0 up"]),
        (("poisson", 1.0, 1.0, True), ["seed True", "from 0 up"]),
    ],
)
def test_invalid_processes_say_what_to_give(args: tuple, words: list[str]) -> None:
    with pytest.raises(ServelabError) as err:
        ArrivalProcess(*args)
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_invalid_counts_and_spans() -> None:
    p = ArrivalProcess("poisson", RATE)
    for bad in (-1, 2.0, True):
        with pytest.raises(ServelabError, match=r"^a schedule of .* requests: give a count"):
            p.schedule_ns(bad)  # type: ignore[arg-type]
    for kind in ("poisson", "constant"):
        with pytest.raises(ServelabError, match="runs past 146 years: give a higher rate"):
            ArrivalProcess(kind, 1e-12).schedule_ns(3)
