"""Bisection across an ordered list of server setups: the first whose metric changed.

Given setups v_0 .. v_n in order (vLLM releases by lock or image, or server arguments as a
stand-in), a known good end g and a known bad end b (g < b), `bisect` keeps the invariant
"v_lo measures SAME as v_g, v_hi DIFFERENT from it" and halves [lo, hi] until hi = lo + 1:
v_hi is the first setup that changed. Each step measures one setup against the good end on
this host, interleaved (`step`: servelab.analysis.samehost's three words for one metric at one
level), so every step's answer is a same-host answer:

- SAME: the change is later, lo = mid;
- DIFFERENT (either direction): it is here or earlier, hi = mid;
- UNKNOWN (the step's rounds ran out undecided): the search stops there and says so, with the
  interval it had; the first changed setup is then not named.

With `check_bad`, the bad end is measured first: unless it is DIFFERENT there is nothing to
look for, and the answer says so. Every step is kept, in order, with its ratio and interval
(`BisectionJson`), and `bisection_section` writes the report's "Bisection" chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from servelab.analysis.equivalence import DIFFERENT, SAME
from servelab.analysis.samehost import interval_text, word_text

FORMAT_VERSION = 1
FOUND, NO_CHANGE, UNDECIDED = "found", "no change at the bad end", "unknown"


@dataclass(frozen=True)
class StepAnswer:
    """What one step measured: the word, its direction, the speed ratio of the setup over the
    good end with its interval, the rounds, and where its run lies."""

    word: str
    direction: str | None
    speed: float | None
    low: float | None
    high: float | None
    rounds: int
    experiment: str
    rounds_needed: int | None = None
    wall_s: float | None = None  # the step's run, start to end
    windows_s: float | None = None  # its points' measured windows, summed


class BisectStepJson(TypedDict):
    index: int
    version: str
    against: str
    word: str
    direction: str | None
    speed: float | None
    low: float | None
    high: float | None
    rounds: int
    rounds_needed: int | None
    experiment: str
    wall_s: float | None
    windows_s: float | None


class BisectionJson(TypedDict):
    format_version: int
    versions: list[str]
    good: str
    bad: str
    metric: str
    level: float
    margin_pct: float
    verdict: str  # found | no change at the bad end | unknown
    first_changed: str | None
    last_same: str | None
    steps: list[BisectStepJson]


@dataclass(frozen=True)
class BisectQuestion:
    """What the bisection looks for: the setups, the two ends, one metric at one level."""

    versions: tuple[str, ...]
    good: int
    bad: int
    metric: str
    level: float
    margin_pct: float
    check_bad: bool = True


def _step_json(q: BisectQuestion, index: int, a: StepAnswer) -> BisectStepJson:
    return {
        "index": index,
        "version": q.versions[index],
        "against": q.versions[q.good],
        "word": a.word,
        "direction": a.direction,
        "speed": a.speed,
        "low": a.low,
        "high": a.high,
        "rounds": a.rounds,
        "rounds_needed": a.rounds_needed,
        "experiment": a.experiment,
        "wall_s": a.wall_s,
        "windows_s": a.windows_s,
    }


def bisect(q: BisectQuestion, step: Callable[[int], StepAnswer]) -> BisectionJson:
    """Search `q` with `step(i)` measuring setup i against the good end."""
    if not 0 <= q.good < q.bad < len(q.versions):
        raise ValueError(f"good ({q.good}) must come before bad ({q.bad}) in the setups")
    steps: list[BisectStepJson] = []
    lo, hi = q.good, q.bad
    verdict = FOUND
    if q.check_bad:
        answer = step(q.bad)
        steps.append(_step_json(q, q.bad, answer))
        if answer.word != DIFFERENT:
            verdict = NO_CHANGE if answer.word == SAME else UNDECIDED
    while verdict == FOUND and hi - lo > 1:
        mid = (lo + hi) // 2
        answer = step(mid)
        steps.append(_step_json(q, mid, answer))
        if answer.word == SAME:
            lo = mid
        elif answer.word == DIFFERENT:
            hi = mid
        else:
            verdict = UNDECIDED
    found = verdict == FOUND
    return {
        "format_version": FORMAT_VERSION,
        "versions": list(q.versions),
        "good": q.versions[q.good],
        "bad": q.versions[q.bad],
        "metric": q.metric,
        "level": q.level,
        "margin_pct": q.margin_pct,
        "verdict": verdict,
        "first_changed": q.versions[hi] if found else None,
        "last_same": q.versions[lo] if found else None,
        "steps": steps,
    }


def _interval(s: BisectStepJson) -> str:
    return interval_text(s["speed"], s["low"], s["high"])


def _word(s: BisectStepJson) -> str:
    return word_text(s["word"], s["direction"], s["rounds_needed"])


def headline(doc: BisectionJson) -> str:
    """The bisection's answer in one line."""
    what = f"{doc['metric']} at {doc['level']:g}"
    if doc["verdict"] == FOUND:
        return (
            f"first changed: {doc['first_changed']} ({what} differs from {doc['good']} beyond "
            f"{doc['margin_pct']:g}%; {doc['last_same']} measures the same)"
        )
    if doc["verdict"] == NO_CHANGE:
        return f"no change: {doc['bad']} measures the same as {doc['good']} ({what})"
    last = doc["steps"][-1]
    return (
        f"UNKNOWN: the step of {last['version']} against {doc['good']} was not decided in "
        f"{last['rounds']} rounds ({what}); measure it with more rounds (sweep.repeats max)"
    )


def time_line(doc: BisectionJson) -> str | None:
    """Wall time against measured windows over the steps, where every step recorded both."""
    walls = [s["wall_s"] for s in doc["steps"]]
    wins = [s["windows_s"] for s in doc["steps"]]
    if not walls or any(w is None for w in walls + wins):
        return None
    wall = sum(w for w in walls if w is not None)
    win = sum(w for w in wins if w is not None)
    ratio = f": {wall / win:.2f}x" if win > 0 else ""
    return f"wall {wall:.1f} s for {win:.1f} s of measured windows over {len(walls)} steps{ratio}"


def bisection_section(doc: BisectionJson) -> list[str]:
    """The report's "Bisection" section: the answer, then the chain of steps."""
    lines = [
        "# Bisection",
        "",
        f"Setups, oldest first: {', '.join(doc['versions'])}. Good end {doc['good']}, bad end "
        f"{doc['bad']}; each step measured one setup against {doc['good']} on this host, "
        f"interleaved, today's client measuring both: {doc['metric']} at level "
        f"{doc['level']:g}, SAME within {doc['margin_pct']:g}%, DIFFERENT beyond it.",
        "",
        f"**{headline(doc)}**",
        "",
        "| step | setup | against | rounds | speed / good [interval] | answer | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(doc["steps"], 1):
        lines.append(
            f"| {i} | {s['version']} | {s['against']} | {s['rounds']} | {_interval(s)} "
            f"| {_word(s)} | {s['experiment']} |"
        )
    times = time_line(doc)
    return [*lines, *(["", times + "."] if times else [])]
