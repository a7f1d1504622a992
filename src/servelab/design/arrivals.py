"""When the requests of an open loop are sent: a schedule of send times drawn from an arrival
process at a request rate.

Three processes, as `vllm bench serve --request-rate R --burstiness B` has them:

- `poisson`: exponential gaps with mean 1/R (a Poisson process);
- `gamma`: gamma-distributed gaps with shape B and mean 1/R (scale 1/(R B)). B = 1 is the
  Poisson process (the same schedule, byte for byte, as `poisson` with the same seed); B < 1 is
  burstier (the squared coefficient of variation of the gaps is 1/B), B > 1 more regular;
- `constant`: every gap exactly 1/R.

A schedule is the send time of each of N requests as integer nanoseconds after the point's
start: the first request at 0, each next one a gap later. Gaps are drawn with numpy's
`Generator(PCG64(seed))`, rounded to whole nanoseconds each and summed in integers, so the same
process, seed and N give the same schedule, byte for byte, on any host.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servelab.errors import ServelabError

KINDS = ("poisson", "gamma", "constant")
_MAX_OFFSET_NS = 2**62  # about 146 years: far beyond any point, well inside int64


def _positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class ArrivalProcess:
    """An arrival process: `kind` (poisson, gamma, constant), `rate` (requests per second),
    `burstiness` (the gamma shape B; 1 for poisson and constant) and the `seed` of its draws.
    An invalid value raises ServelabError, one line naming the value and what to give."""

    kind: str
    rate: float
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ServelabError(
                f"arrival kind {self.kind!r} is unknown: use one of {', '.join(KINDS)}"
            )
        if not _positive(self.rate):
            raise ServelabError(
                f"arrival rate {self.rate!r} is not a finite number above 0: "
                "give the requests per second to send"
            )
        if not _positive(self.burstiness):
            raise ServelabError(
                f"arrival burstiness {self.burstiness!r} is not a finite number above 0: give "
                "the gamma shape (1: Poisson, below 1: burstier, above 1: more regular)"
            )
        if self.kind != "gamma" and self.burstiness != 1:
            raise ServelabError(
                f"arrival burstiness {self.burstiness!r} applies to gamma arrivals only: "
                f"set kind to gamma, or leave burstiness at 1 for {self.kind}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ServelabError(
                f"arrival seed {self.seed!r} is not an integer from 0 up: give one, "
                "e.g. the experiment's seed"
            )

    def gaps_s(self, n: int) -> npt.NDArray[np.float64]:
        """The n gaps between consecutive sends, in seconds, as drawn (before rounding)."""
        _check_count(n)
        if self.kind == "constant":
            return np.full(n, 1.0 / self.rate)
        rng = np.random.Generator(np.random.PCG64(self.seed))
        shape = self.burstiness if self.kind == "gamma" else 1.0
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)

    def schedule_ns(self, n: int) -> npt.NDArray[np.int64]:
        """The send times of n requests, integer nanoseconds after the point's start: 0 for the
        first, then the cumulative sum of n - 1 gaps, each rounded to a whole nanosecond."""
        _check_count(n)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if self.kind == "constant":
            # each time from its index, not a running sum: no rounding carried along
            times = np.rint(np.arange(n, dtype=np.float64) * (1e9 / self.rate))
            _check_span(float(times[-1]), n, self.rate)
            return times.astype(np.int64)
        gaps = np.rint(self.gaps_s(n - 1) * 1e9)
        _check_span(float(gaps.sum()), n, self.rate)
        # the rounded gaps summed in integers: exact, whatever the order of the additions
        ints = gaps.astype(np.int64)
        return np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(ints, dtype=np.int64)))


def _check_span(last_ns: float, n: int, rate: float) -> None:
    if not last_ns <= _MAX_OFFSET_NS:
        raise ServelabError(
            f"a schedule of {n} requests at {rate!r} req/s runs past 146 years: "
            "give a higher rate or fewer requests"
        )


def _check_count(n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ServelabError(f"a schedule of {n!r} requests: give a count from 0 up")


def schedule_sha256(offsets_ns: Sequence[int]) -> str:
    """The sha256 of a schedule's send times, written as decimal integers one per line: what a
    point records of the schedule it was sent on, and a reproduction compares."""
    text = "".join(f"{int(t)}\n" for t in offsets_ns)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def scheduled_rate(offsets_ns: Sequence[int]) -> float | None:
    """The rate a schedule itself holds: (n - 1) sends after the first over the last send's
    time; None for fewer than two sends or all at once. A drawn schedule's differs from its
    process's rate by sampling (about 1/sqrt(n) for Poisson)."""
    if len(offsets_ns) < 2 or int(offsets_ns[-1]) <= 0:
        return None
    return (len(offsets_ns) - 1) / (int(offsets_ns[-1]) / 1e9)
