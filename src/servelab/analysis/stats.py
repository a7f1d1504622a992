"""Repeat statistics and paired comparisons.

A difference is called real only when a test and a practical threshold agree. The test is a
paired t-test on log ratios (a_r / b_r over repeats r), which can call a consistent 4-5%
difference real with 3 repeats (a sign or rank test cannot: its smallest two-sided p at n = 3
is 0.25). The sign agreement ("3/3") is reported beside it. Never "significant" when the test
could not run.

Two independent runs (two releases of an experiment) have no pairing: `two_sample` tests
their repeats with Welch's t-test on the logs, under the same practical threshold, and
`ratio_ci` gives the ratio of their geometric means with its confidence interval.

Many tests at once (every point and metric of two releases) are controlled with
`benjamini_hochberg`: the Benjamini-Hochberg step-up procedure at a false discovery rate q.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from servelab.documents.declared import EvidenceLevel


@dataclass(frozen=True)
class Describe:
    n: int
    mean: float | None
    sd: float | None
    cv_pct: float | None
    ci95_low: float | None
    ci95_high: float | None
    min: float | None
    max: float | None


def describe(values: Sequence[float]) -> Describe:
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    n = int(xs.size)
    if n == 0:
        return Describe(0, None, None, None, None, None, None, None)
    mean = float(xs.mean())
    if n == 1:  # no spread and no interval from one value
        return Describe(1, mean, None, None, None, None, mean, mean)
    sd = float(xs.std(ddof=1))
    cv = 100.0 * sd / abs(mean) if mean != 0 else None
    half = float(sps.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return Describe(n, mean, sd, cv, mean - half, mean + half, float(xs.min()), float(xs.max()))


def one_sided_bounds(values: Sequence[float], alpha: float) -> tuple[float | None, float | None]:
    """The lower and the upper one-sided (1 - alpha) confidence bound of the mean (Student's
    t); (None, None) with fewer than two values."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    n = int(xs.size)
    if n < 2:
        return None, None
    mean, sd = float(xs.mean()), float(xs.std(ddof=1))
    half = float(sps.t.ppf(1.0 - alpha, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


@dataclass(frozen=True)
class Paired:
    n: int
    mean_rel_diff_pct: float | None
    agree: str  # repeats where a > b, e.g. "3/3"
    p_value: float | None
    verdict: str  # "a > b" | "a < b" | "not significant" | "not testable: ..."


def _pairs(a: Sequence[float], b: Sequence[float]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]


def mean_rel_diff_pct(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Mean over repeats of a/b - 1, in %; None without pairs, or when a b is zero."""
    pairs = _pairs(a, b)
    if not pairs:
        return None
    if any(y <= 0 or x <= 0 for x, y in pairs):
        rel = [100.0 * (x / y - 1) if y else math.nan for x, y in pairs]
        return float(np.mean(rel)) if all(map(math.isfinite, rel)) else None
    return float(np.mean(np.asarray([x / y for x, y in pairs]) - 1.0) * 100.0)


def paired(a: Sequence[float], b: Sequence[float], threshold_pct: float, alpha: float) -> Paired:
    """Compare a and b repeat by repeat (a[i] pairs with b[i]); a difference is real when the
    test's p is under `alpha` and the mean difference reaches `threshold_pct` (the analysis
    section's)."""
    pairs = _pairs(a, b)
    n = len(pairs)
    if n == 0:
        return Paired(0, None, "0/0", None, "not testable: no paired repeats")
    wins = sum(1 for x, y in pairs if x > y)
    agree = f"{wins}/{n}"
    mean_rel = mean_rel_diff_pct(a, b)
    if any(y <= 0 or x <= 0 for x, y in pairs):
        return Paired(n, mean_rel, agree, None, "not testable: a value is zero or negative")
    assert mean_rel is not None
    if n < 2:
        return Paired(n, mean_rel, agree, None, f"not testable: n = {n}")
    logs = np.log(np.asarray([x / y for x, y in pairs]))
    sd = float(logs.std(ddof=1))
    mean_log = float(logs.mean())
    if sd == 0.0:
        # identical ratio in every repeat: no noise, the sign alone decides
        p = 0.0 if mean_log != 0.0 else 1.0
    else:
        t = mean_log / (sd / math.sqrt(n))
        p = float(2.0 * sps.t.sf(abs(t), n - 1))
    if p < alpha and abs(mean_rel) >= threshold_pct:
        verdict = "a > b" if mean_rel > 0 else "a < b"
    else:
        verdict = "not significant"
    return Paired(n, mean_rel, agree, p, verdict)


@dataclass(frozen=True)
class TwoSample:
    """Two independent samples compared (`two_sample`): `paired`'s fields, with the size of
    each sample."""

    n_a: int
    n_b: int
    mean_rel_diff_pct: float | None  # mean(a) / mean(b) - 1, in %
    agree: str  # pairs (x of a, y of b) where x > y, of all n_a * n_b pairs, e.g. "9/9"
    p_value: float | None
    verdict: str  # "a > b" | "a < b" | "not significant" | "not testable: ..."


def two_sample(
    a: Sequence[float], b: Sequence[float], threshold_pct: float, alpha: float
) -> TwoSample:
    """Compare two independent runs' repeats (no repeat of a pairs with one of b): Welch's
    t-test on the logs of the values, and the change of the means, mean(a) / mean(b) - 1. The
    same rule as `paired`: a difference is real when the test's p is under `alpha` and the
    change reaches `threshold_pct`."""
    xs = [float(v) for v in a if v is not None]
    ys = [float(v) for v in b if v is not None]
    wins = sum(1 for x in xs for y in ys if x > y)
    agree = f"{wins}/{len(xs) * len(ys)}"
    if not xs or not ys:
        return TwoSample(len(xs), len(ys), None, agree, None, "not testable: an empty sample")
    mean_b = float(np.mean(ys))
    change = 100.0 * (float(np.mean(xs)) / mean_b - 1.0) if mean_b else None
    if change is None or min(xs + ys) <= 0:
        verdict = "not testable: a value is zero or negative"
        return TwoSample(len(xs), len(ys), change, agree, None, verdict)
    if len(xs) < 2 or len(ys) < 2:
        verdict = f"not testable: n = {len(xs)} and {len(ys)}"
        return TwoSample(len(xs), len(ys), change, agree, None, verdict)
    la, lb = np.log(np.asarray(xs)), np.log(np.asarray(ys))
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    diff = float(la.mean() - lb.mean())
    if va + vb == 0.0:
        # no spread on either side: the sign alone decides, as in `paired`
        p = 0.0 if diff != 0.0 else 1.0
    else:
        df = (va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1))
        p = float(2.0 * sps.t.sf(abs(diff) / math.sqrt(va + vb), df))
    if p < alpha and abs(change) >= threshold_pct:
        verdict = "a > b" if change > 0 else "a < b"
    else:
        verdict = "not significant"
    return TwoSample(len(xs), len(ys), change, agree, p, verdict)


@dataclass(frozen=True)
class Ratio:
    """after / before as a ratio of geometric means, with its (1 - alpha) confidence
    interval [low, high] (Welch's t on the logs); low and high are None when the interval
    cannot be computed (fewer than two values a side)."""

    value: float
    low: float | None
    high: float | None


def ratio_ci(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Ratio | None:
    """The ratio of a's geometric mean to b's and its (1 - alpha) Welch interval on the logs;
    None when a side is empty or holds a value that is zero or negative."""
    xs = [float(v) for v in a if v is not None]
    ys = [float(v) for v in b if v is not None]
    if not xs or not ys or min(xs + ys) <= 0:
        return None
    la, lb = np.log(np.asarray(xs)), np.log(np.asarray(ys))
    diff = float(la.mean() - lb.mean())
    if la.size < 2 or lb.size < 2:
        return Ratio(math.exp(diff), None, None)
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    if va + vb == 0.0:
        return Ratio(math.exp(diff), math.exp(diff), math.exp(diff))
    df = (va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1))
    half = float(sps.t.ppf(1.0 - alpha / 2, df)) * math.sqrt(va + vb)
    return Ratio(math.exp(diff), math.exp(diff - half), math.exp(diff + half))


def paired_ratio_ci(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Ratio | None:
    """a over b repeat by repeat (a[i] pairs with b[i]): the geometric mean of the ratios with
    its (1 - alpha) interval (Student's t on the log ratios, n - 1 degrees of freedom), the
    interval `paired` tests; None without two pairs or with a value that is not positive."""
    pairs = _pairs(a, b)
    if len(pairs) < 2 or any(x <= 0 or y <= 0 for x, y in pairs):
        return None
    logs = np.log(np.asarray([x / y for x, y in pairs]))
    mean = float(logs.mean())
    half = float(sps.t.ppf(1.0 - alpha / 2, logs.size - 1)) * float(logs.std(ddof=1))
    half /= math.sqrt(logs.size)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def benjamini_hochberg(p_values: Sequence[float | None], q: float = 0.05) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values of `p_values` (None stays None and is not
    counted among the tests): a test is a discovery at false discovery rate q when its
    adjusted p is at most q. With m tests and the p-values sorted, p_(i) is adjusted to
    min over j >= i of m * p_(j) / j, capped at 1 (scipy.stats.false_discovery_control,
    method "bh", gives the same)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q = {q}: a false discovery rate must lie between 0 and 1")
    tested = [(p, i) for i, p in enumerate(p_values) if p is not None]
    m = len(tested)
    out: list[float | None] = [None] * len(p_values)
    running = 1.0
    for rank, (p, i) in reversed(list(enumerate(sorted(tested), 1))):
        running = min(running, m * p / rank)
        out[i] = min(running, 1.0)
    return out


def evidence_level(repeats: int | None, test: Paired | None = None) -> EvidenceLevel:
    """What a diagnosis or a knee rests on: `repeats` (the fewest repeats of the points it
    reads; None for a fact from the startup log), `tested` (a paired t-test ran and called the
    difference real), `p_value` (the test's, when one ran) and `label`, the words the report
    and `servelab analyze` print: "1 repeat: not tested", "3 repeats: paired t-test p = 0.0001
    (3/3 agree)", "3 repeats: paired t-test not significant (p = 0.21, 2/3 agree)"."""
    if repeats is None:
        return {"repeats": None, "tested": False, "p_value": None, "label": LOG_FACT}
    word = "repeat" if repeats == 1 else "repeats"
    if test is None or test.p_value is None:
        return {
            "repeats": repeats,
            "tested": False,
            "p_value": None,
            "label": f"{repeats} {word}: not tested",
        }
    real = test.verdict in ("a > b", "a < b")
    said = (
        f"paired t-test p = {test.p_value:.3g} ({test.agree} agree)"
        if real
        else f"paired t-test not significant (p = {test.p_value:.3g}, {test.agree} agree)"
    )
    return {
        "repeats": repeats,
        "tested": real,
        "p_value": test.p_value,
        "label": f"{repeats} {word}: {said}",
    }


LOG_FACT = "startup log: a fact, not a measurement"
