"""The host ratio between two runs with its interval: a bootstrap over the canaries' timings.

A run's canary is a list of records, one per `canary.before` and `canary.after` of each
configuration's run.json (or, on a GPU runtime, of its `canary.gpu`), each holding the repeats
of two parts: the seconds of a fixed work (lower is faster) and the GB/s of fixed copies
(higher is faster). `Record` holds one record's repeats of both parts.

- A run's speed in a part is the mean over its records of each record's mean log repeat (a
  geometric mean in which every record weighs alike);
- the host ratio of the later run over the earlier one is, on logs, the mean of the two parts'
  log speed ratios (compute: the earlier seconds over the later; bandwidth: the later GB/s over
  the earlier); above 1 the later host is faster;
- its interval is the 2.5th and 97.5th percentiles of that log ratio over `RESAMPLES`
  bootstrap resamples of both runs, each drawn in two stages as the timings were taken: the
  run's records with replacement (how the host's speed moved between timings: before against
  after a sweep, one configuration's against another's), then each drawn record's repeats with
  replacement (the noise within one timing). One draw of records serves both parts, which were
  timed together.

Deterministic: the generator's seed is derived from the timings themselves (a SHA-256 of their
text), so the same canaries always give the same interval, to the byte.

Records written before the repeats were kept hold a part's median, min and max of `repeats`:
with 3 repeats those three numbers are the repeats; with 1, the one value; with 2, min and max;
with more than 3 (min, median, max) stand for them, a sample spread as wide as the real one but
smaller, so the interval they give is wider than the repeats' (never narrower: a doubt the rule
resolves to UNKNOWN, never to a verdict).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Record:
    """One canary timing: the repeats of its seconds part and of its GB/s part."""

    seconds: tuple[float, ...]
    gbs: tuple[float, ...]


@dataclass(frozen=True)
class LogRatio:
    """The host ratio on logs: the point (`value`), its interval (`low`, `high`) and the two
    parts' own point ratios (compute, bandwidth, on logs)."""

    value: float
    low: float
    high: float
    compute: float
    bandwidth: float


def repeats_of(median: float, low: float, high: float, repeats: int) -> tuple[float, ...]:
    """A part's repeats as a record without `timings` gives them (module docstring)."""
    if repeats <= 1:
        return (median,)
    if repeats == 2:
        return (low, high)
    return (low, median, high)


def _seed(runs: Sequence[Sequence[Record]]) -> int:
    text = json.dumps([[[r.seconds, r.gbs] for r in run] for run in runs])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _point(records: Sequence[Record]) -> tuple[float, float]:
    """A run's mean log seconds and mean log GB/s (each record's mean, then their mean)."""
    sec = [float(np.mean(np.log(r.seconds))) for r in records]
    gbs = [float(np.mean(np.log(r.gbs))) for r in records]
    return sum(sec) / len(sec), sum(gbs) / len(gbs)


def _within(
    values: tuple[float, ...], shape: tuple[int, int], rng: np.random.Generator
) -> np.ndarray:
    """Each of `shape` draws: the mean log of one resample of `values`."""
    logs = np.log(np.asarray(values, dtype=float))
    picks = rng.integers(0, len(logs), (*shape, len(logs)))
    means: np.ndarray = logs[picks].mean(axis=-1)
    return means


def _resampled(
    records: Sequence[Record], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """RESAMPLES two-stage resamples of a run: its mean log seconds and mean log GB/s."""
    k = len(records)
    drawn = rng.integers(0, k, (RESAMPLES, k))
    sec = np.zeros((RESAMPLES, k))
    gbs = np.zeros((RESAMPLES, k))
    for j, r in enumerate(records):
        here = drawn == j
        sec = np.where(here, _within(r.seconds, (RESAMPLES, k), rng), sec)
        gbs = np.where(here, _within(r.gbs, (RESAMPLES, k), rng), gbs)
    return sec.mean(axis=1), gbs.mean(axis=1)


def log_ratio(before: Sequence[Record], after: Sequence[Record]) -> LogRatio:
    """The after run's host speed over the before run's, on logs, with its bootstrap interval
    (module docstring). Both runs hold at least one record, every repeat positive."""
    (bs, bg), (as_, ag) = _point(before), _point(after)
    compute, bandwidth = bs - as_, ag - bg
    value = (compute + bandwidth) / 2.0
    rng = np.random.default_rng(_seed([before, after]))
    b_sec, b_gbs = _resampled(before, rng)
    a_sec, a_gbs = _resampled(after, rng)
    draws = ((b_sec - a_sec) + (a_gbs - b_gbs)) / 2.0
    tail = (1.0 - LEVEL) / 2.0
    low, high = (float(x) for x in np.quantile(draws, [tail, 1.0 - tail]))
    return LogRatio(value, min(low, value), max(high, value), compute, bandwidth)


def as_ratios(r: LogRatio) -> tuple[float, float, float]:
    """(ratio, low, high) of a LogRatio, off the logs."""
    return math.exp(r.value), math.exp(r.low), math.exp(r.high)
