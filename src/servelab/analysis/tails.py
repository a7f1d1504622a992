"""How many requests a point needs for the percentiles an experiment's claims name: a
percentile is reported only with its 95% interval, which needs `servelab.metrics.
samples_needed` values (368 for p99); a config whose smallest point sends fewer hears so
before anything is measured, with the `workload.waves` that would do."""

from __future__ import annotations

import math
import re

from servelab.experiment import Experiment
from servelab.metrics import LATENCIES, percentile_of, samples_needed

_METRIC = re.compile(r"\b(?:p\d+|median)_(?:" + "|".join(LATENCIES) + r")_ms\b")


def named_percentiles(claims: tuple[str, ...]) -> list[str]:
    """The percentile metrics the claims name (p99_ttft_ms, ...), in order of first mention."""
    found: list[str] = []
    for claim in claims:
        found += [m for m in _METRIC.findall(claim) if m not in found]
    return found


def smallest_point(exp: Experiment) -> tuple[int, str] | None:
    """The fewest requests a point of the sweep sends, and how (None where the workload
    decides it: a trace replay)."""
    if exp.workload.trace is not None:
        return None
    sweep = exp.sweep
    if sweep.arrival is not None and sweep.rate is not None:
        rate = min(sweep.rate)
        return sweep.arrival.requests(rate), f"rate {rate:g} x sweep.arrival.duration_s"
    c = min(sweep.concurrency or (1,))
    return c * exp.workload.waves, f"concurrency {c} x workload.waves {exp.workload.waves}"


def tail_notes(exp: Experiment) -> list[str]:
    """One line per percentile the claims name that the smallest point cannot report."""
    smallest = smallest_point(exp)
    if smallest is None:
        return []
    n, how = smallest
    notes = []
    for metric in named_percentiles(exp.analysis.claims):
        of = percentile_of(metric)
        assert of is not None
        need = samples_needed(of[1])
        if n >= need:
            continue
        fix = (
            f"set workload.waves to at least {math.ceil(need / min(exp.sweep.concurrency))}"
            if exp.sweep.concurrency
            else "raise sweep.arrival.duration_s"
        )
        notes.append(
            f"tails: a claim names {metric}: a point needs {need} requests to report it with "
            f"its 95% interval, the smallest here sends {n} ({how}), so the claim will read "
            f"inconclusive (insufficient); {fix}"
        )
    return notes
