"""Three words for a change measured on one host: SAME, DIFFERENT (faster or slower), UNKNOWN.

A same-host comparison (a rerun of a reference beside the current side, a bisection step, a
runtime A/B) gives, per point and metric, B / A as a ratio with its confidence interval. In
speed terms (a throughput B / A; a latency A / B, since a faster server has the lower
latency), with the interval [low, high] and an equivalence margin m (`margin_pct`):

- SAME: the interval lies inside [1 / (1 + m), 1 + m]: whatever the difference, it is smaller
  than the margin (two one-sided tests, each at alpha, as equivalence testing reads a
  1 - 2 alpha interval);
- DIFFERENT: the interval lies wholly outside it, above (faster) or below (slower): one
  one-sided test at alpha. Each row makes at most one of these claims, so a 1 - 2 alpha
  interval bounds a row's chance of a wrong word by alpha;
- UNKNOWN: neither. More rounds narrow the interval; `rounds_needed` says how many the
  observed spread would need (the interval's half-width shrinks as t / sqrt(n)), or None where
  the ratio itself sits on the margin, so that no number of rounds at this spread decides it.

Why the margin and not the analysis's practical threshold: on a 2-core host the interleaved
round-to-round spread of the log ratio is 3% on a quiet host and 8-9% beside hypervisor steal
(benchmarks/README.md, "Same-host verdicts (`servelab rerun`), measured"), so an interval
within +-2% needs hundreds of rounds. The default margin (`DEFAULT_MARGIN_PCT`, 10%) is the
largest that still separates a 20% regression (DIFFERENT) from no change (SAME); 15% would
leave a 20% regression UNKNOWN in most runs. At a 3% spread 6 rounds decide most rows; at 8%
they do not, and the answer is UNKNOWN with the rounds it would need.

The family: every (point, metric) of one comparison is one decision, and a wrong SAME or
DIFFERENT anywhere is an error. `family_alpha` splits the error rate over the decisions and
over the looks the plan allows (Bonferroni, as the sequential plan spends its alpha: it holds
for any dependence): each row's alpha is alpha / (decisions x looks), its interval at
1 - 2 x that.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

SAME = "SAME"
DIFFERENT = "DIFFERENT"
UNKNOWN = "UNKNOWN"
WORDS = (SAME, DIFFERENT, UNKNOWN)
FASTER = "faster"
SLOWER = "slower"
DEFAULT_MARGIN_PCT = 10.0
METHOD = (
    "paired Student's t interval on the log ratios (two one-sided tests), Bonferroni over "
    "points x metrics x looks; SAME inside the margin, DIFFERENT outside it"
)
# the most rounds `rounds_needed` looks for: beyond it the answer is "more than this"
MAX_ROUNDS_LOOKED_FOR = 200


@dataclass(frozen=True)
class Decision:
    """One point and metric: `word` (SAME, DIFFERENT or UNKNOWN), `direction` (faster or
    slower, for DIFFERENT), the speed ratio B / A (above 1: B faster) with its interval, the
    rounds it rests on, and for UNKNOWN the rounds the observed spread would need in all
    (None: the ratio sits on the margin, or no spread was measured)."""

    word: str
    direction: str | None
    speed: float | None
    low: float | None
    high: float | None
    n: int
    margin_pct: float
    rounds_needed: int | None = None
    why: str | None = None

    @property
    def label(self) -> str:
        """SAME, DIFFERENT (slower), UNKNOWN: the word as the report prints it."""
        return f"{self.word} ({self.direction})" if self.direction else self.word


def family_alpha(alpha: float, decisions: int, looks: int = 1) -> float:
    """Each interval's error rate when a family of `decisions` is read at `looks` looks."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha = {alpha}: an error rate lies between 0 and 1")
    return alpha / max(1, decisions) / max(1, looks)


def word_for(low: float, high: float, margin_pct: float) -> tuple[str, str | None]:
    """The word for a speed ratio's interval [low, high] against the margin."""
    if margin_pct <= 0:
        raise ValueError(f"margin_pct = {margin_pct}: an equivalence margin is above 0")
    top = 1.0 + margin_pct / 100.0
    if 1.0 / top <= low and high <= top:
        return SAME, None
    if high < 1.0 / top:
        return DIFFERENT, SLOWER
    if low > top:
        return DIFFERENT, FASTER
    return UNKNOWN, None


@functools.lru_cache(maxsize=4096)
def _t(alpha: float, df: int) -> float:
    """Student's t quantile of a two-sided (1 - alpha) interval (cached: a family and the
    rounds `rounds_needed` tries ask the same few)."""
    return float(sps.t.ppf(1.0 - alpha / 2.0, df))


def _half_width(sd: float, n: int, alpha: float) -> float:
    return _t(alpha, n - 1) * sd / math.sqrt(n)


def rounds_needed(mean_log: float, sd: float, margin_pct: float, alpha: float) -> int | None:
    """The fewest rounds at which a two-sided (1 - alpha) interval of this mean and spread
    would be decided (SAME or DIFFERENT); None where none up to MAX_ROUNDS_LOOKED_FOR is (the
    mean on the margin)."""
    edge = math.log(1.0 + margin_pct / 100.0)
    room = abs(abs(mean_log) - edge)  # how far the mean stands from the margin's edge
    if sd <= 0.0 or room == 0.0:
        return None
    for n in range(2, MAX_ROUNDS_LOOKED_FOR + 1):
        if _half_width(sd, n, alpha) < room:
            return n
    return None


def decide(
    b: Sequence[float],
    a: Sequence[float],
    higher_is_faster: bool,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    alpha: float = 0.05,
) -> Decision:
    """B against A, round by round (b[i] pairs with a[i]): the speed ratio's interval (the
    geometric mean of B / A, or A / B for a latency, with Student's t on the log ratios at
    1 - 2 alpha: each one-sided bound at 1 - alpha), and its word, wrong with a chance of at
    most alpha. Fewer than two pairs, or a value that is not positive: UNKNOWN
    with the reason."""
    pairs = [(float(x), float(y)) for x, y in zip(b, a, strict=False) if x is not None and y]
    n = len(pairs)
    if any(x <= 0 or y <= 0 for x, y in pairs):
        return Decision(UNKNOWN, None, None, None, None, n, margin_pct, None, "a value <= 0")
    if n < 2:
        why = f"{n} paired round{'s' * (n != 1)}: an interval needs 2"
        return Decision(UNKNOWN, None, None, None, None, n, margin_pct, 2, why)
    logs = np.log(np.asarray([x / y for x, y in pairs]))
    if not higher_is_faster:
        logs = -logs
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    half = _half_width(sd, n, 2.0 * alpha)
    low, high = math.exp(mean - half), math.exp(mean + half)
    word, direction = word_for(low, high, margin_pct)
    need = None if word != UNKNOWN else rounds_needed(mean, sd, margin_pct, 2.0 * alpha)
    return Decision(word, direction, math.exp(mean), low, high, n, margin_pct, need)
