"""Early stopping on a share of requests: whether a point meets a percentile SLO, decided from
how many of its requests were over the bound, with the exact (Clopper-Pearson) binomial bounds
on the share over, as MLPerf LoadGen's early stopping decides a percentile latency target.

A p99 SLO allows 1% of requests over its bound. Of n requests, k were over (a failed request
counts as over). The share over the bound that the server would show on ever more requests
lies, at one-sided confidence 95%, at or under `upper` and at or above `lower`:

- **meets** when `upper` <= the allowed share: even the worst share the data allow is within it;
- **fails** when `lower` > the allowed share: even the best share the data allow is beyond it;
- **undecided** otherwise: the requests are too few to tell.

A point of 64 requests all within the bound is undecided for a p99 SLO (upper 4.6%): a p99 SLO
needs at least 299 requests, all within the bound, before it can be met
(`min_requests(0.01) == 299`); each request over the bound needs more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import beta

__all__ = [
    "CONFIDENCE",
    "DECISIONS",
    "Decision",
    "allowed_share",
    "clopper_pearson",
    "decide",
    "min_requests",
]

# one-sided confidence of each bound
CONFIDENCE = 0.95
DECISIONS = ("meets", "fails", "undecided")


def allowed_share(target: float) -> float:
    """The share of requests allowed over the bound for a target share within it (0.99 ->
    0.01), rounded to 12 decimals so that 1 - 0.99 reads 0.01."""
    return round(1.0 - target, 12)


def _check(k: int, n: int, confidence: float) -> None:
    if not (isinstance(n, int) and isinstance(k, int) and 0 <= k <= n):
        raise ValueError(f"k={k!r} of n={n!r}: give whole numbers with 0 <= k <= n")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r}: give a probability between 0 and 1")


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact one-sided bounds on a binomial share from k successes in n trials, each at
    `confidence`: (lower, upper) with P(X >= k | lower) = P(X <= k | upper) = 1 - confidence.
    lower is 0 for k = 0, upper 1 for k = n; (0, 1) for n = 0 (nothing is known)."""
    _check(k, n, confidence)
    alpha = 1.0 - confidence
    lower = 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(beta.ppf(confidence, k + 1, n - k))
    return lower, upper


def min_requests(allowed: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest requests that can ever decide "meets" (every one within the bound): the
    smallest n whose upper bound for k = 0 is at or under `allowed` (299 for 1% at 95%);
    None when no number can (`allowed` 0: a target of every request)."""
    if not 0 <= allowed < 1:
        raise ValueError(f"allowed share {allowed!r}: give a share from 0 up to, not with, 1")
    if allowed == 0:
        return None
    # upper(0, n) = 1 - (1 - confidence)^(1/n): the closed form, then checked by the bound
    n = max(1, math.ceil(math.log(1.0 - confidence) / math.log(1.0 - allowed)))
    while clopper_pearson(0, n, confidence)[1] > allowed:
        n += 1
    while n > 1 and clopper_pearson(0, n - 1, confidence)[1] <= allowed:
        n -= 1
    return n


def _pct(share: float, digits: int = 2) -> str:
    """A share as a percentage, to `digits` significant digits: 0.0093 -> 0.93%, 0.046 ->
    4.6%."""
    v = 100.0 * share
    if v == 0:
        return "0%"
    return f"{v:.{digits}g}%" if v < 10**digits else f"{v:.0f}%"


def _beside(share: float, allowed: str) -> str:
    """`share` as a percentage with the digits it needs to read apart from `allowed` (as
    written): an upper bound of 1.0002% is not "1%" beside an allowed 1%."""
    for digits in range(2, 7):
        text = _pct(share, digits)
        if text != allowed:
            return text
    return _pct(share, 7)


@dataclass(frozen=True)
class Decision:
    """The early-stop decision on one point: `decision` (meets, fails or undecided) from `k`
    of `n` requests over the bound, the one-sided `confidence` bounds `lower` and `upper` on
    the share over, and the `allowed` share over (1 - the target)."""

    decision: str
    n: int
    k: int
    lower: float
    upper: float
    allowed: float
    confidence: float = CONFIDENCE

    @property
    def needs(self) -> int | None:
        """The fewest requests that can decide "meets" at this allowed share (min_requests)."""
        return min_requests(self.allowed, self.confidence)

    def text(self) -> str:
        """The decision in one line, e.g. "meets: 0 of 320 over (upper 0.93%, allowed 1%)",
        "undecided: 0 of 64 over (upper 4.6% > 1%; needs >= 299)"."""
        allowed = f"{100 * self.allowed:.6g}%"
        lower, upper = _beside(self.lower, allowed), _beside(self.upper, allowed)
        if self.n == 0:
            needs = self.needs
            return f"{self.decision}: no requests" + (
                f" (needs >= {needs})" if needs is not None else ""
            )
        head = f"{self.decision}: {self.k} of {self.n} over"
        if self.decision == "meets":
            return f"{head} (upper {upper}, allowed {allowed})"
        if self.decision == "fails":
            return f"{head} (lower {lower} > {allowed})"
        needs = self.needs
        if needs is None:
            why = f"upper {upper} > {allowed}; no number of requests can meet it"
        elif self.n < needs:
            why = f"upper {upper} > {allowed}; needs >= {needs}"
        else:
            why = f"lower {lower} <= {allowed} < upper {upper}"
        return f"{head} ({why})"


def decide(n: int, k: int, allowed: float, confidence: float = CONFIDENCE) -> Decision:
    """Whether k of n requests over the bound meet an SLO that allows the share `allowed` over
    (0.01 for a p99 SLO): meets when the upper bound on the share over is at or under
    `allowed`, fails when the lower bound is above it, undecided otherwise (and always for
    n = 0)."""
    if not 0 <= allowed < 1:
        raise ValueError(f"allowed share {allowed!r}: give a share from 0 up to, not with, 1")
    lower, upper = clopper_pearson(k, n, confidence)
    if n > 0 and upper <= allowed:
        decision = "meets"
    elif lower > allowed:
        decision = "fails"
    else:
        decision = "undecided"
    return Decision(decision, n, k, lower, upper, allowed, confidence)
