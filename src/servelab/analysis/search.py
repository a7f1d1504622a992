"""SLO capacity by search: the highest request rate whose SLO attainment stays at or above a
target, found by bracketing then bisection on measured rates (docs/analysis.md, "SLO capacity
by search").

The search is a pure driver over a callable: `search_rate(measure, spec)` asks
`measure(rate, round_)` for the outcome of one round of a rate (each repeat's SLO attainment,
how many requests it sent and whether the repeat was valid) and decides from those outcomes
alone whether to measure the rate again and which rate to measure next. The same outcomes give
the same path, step for step. `slo_attainment` is a repeat's attainment from its request
records; search.json's one writer and its checked reader are in analysis.search_records.

A rate's outcome is the early-stop decision (servelab.analysis.early_stop) over the requests
of its valid repeats, pooled: of n requests, k missed the SLO (a failed request misses it); the
rate **meets** when the one-sided 95% upper bound on the share that misses is at or under
1 - target, **fails** when the lower bound is above it, and is **undecided** otherwise (too few
requests to tell; a rate with no valid repeat has none). Invalid repeats are left out, as the
analysis leaves out invalid points. An undecided rate is measured again, one more round of the
repeats (more requests, pooled with the rounds before), up to `max_rounds` rounds; a rate still
undecided then counts as not meeting for the bracketing (never as a pass) and the answer names
it (`Answer.undecided`).

The answer is a bracket: the highest rate that met and the lowest rate above it that did not
("between 3.5 and 3.75 req/s"). Every rate that met lies below every rate that did not on the
path, so the bracket holds every crossing the measurements saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.analysis.early_stop import CONFIDENCE, Decision, allowed_share, decide
from servelab.client import RequestRecord
from servelab.documents.declared import (
    AnswerJson,
    RepeatJson,
    SearchJson,
    SloBoundsJson,
    SpecJson,
    StepJson,
)
from servelab.errors import ServelabError
from servelab.metrics import request_latencies
from servelab.store import paths

__all__ = [
    "FORMAT_VERSION",
    "SEARCH_FILE",
    "Measure",
    "STOPS",
    "Answer",
    "RateOutcome",
    "RepeatOutcome",
    "SearchResult",
    "SearchSpec",
    "SloBounds",
    "Step",
    "request_meets",
    "search_rate",
    "slo_attainment",
]

SEARCH_FILE = paths.SEARCH_FILE
FORMAT_VERSION = 2
# why a search stopped (Answer.stopped)
STOPS = ("converged", "resolution", "max_measurements", "min_rate", "max_rate")


def _digits(x: float) -> float:
    """A number to 9 significant digits, as search.json writes floats: the record then reads
    back to the very rates that were measured."""
    return float(f"{x:.9g}")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _floats(obj: object, names: Sequence[str]) -> None:
    """Hold the numbers `names` of a frozen dataclass as floats (None stays None): a spec of
    ints and one read back from its JSON are then the same, and write the same bytes."""
    for name in names:
        v = getattr(obj, name)
        if v is not None:
            object.__setattr__(obj, name, float(v))


@dataclass(frozen=True)
class SloBounds:
    """The per-request bounds of the SLO, in ms (None: no bound on that latency). A request
    meets the SLO when it succeeded and each of its latencies, counted from its scheduled send,
    is at or under its bound; TPOT is not bounded for a request of a single output token (it
    has none)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is not None and not (_number(v) and v > 0):
                raise ServelabError(
                    f"SLO bound {name} {v!r} is not a number above 0: give the bound in ms, "
                    "or null for none"
                )
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ServelabError(
                "an SLO with no bound: set at least one of ttft_ms, tpot_ms, e2el_ms"
            )
        _floats(self, ("ttft_ms", "tpot_ms", "e2el_ms"))

    def to_json(self) -> SloBoundsJson:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms}


def request_meets(rec: RequestRecord, bounds: SloBounds) -> bool:
    """Whether one request meets every bound: it succeeded with output, and its TTFT, TPOT and
    E2EL (servelab.metrics.request_latencies, from the scheduled send) are within the bounds."""
    if not (rec.ok and rec.chunk_offsets_us):
        return False
    lat = request_latencies(rec)
    for value, bound in (
        (lat["ttft"], bounds.ttft_ms),
        (lat["tpot"], bounds.tpot_ms),
        (lat["e2el"], bounds.e2el_ms),
    ):
        if bound is not None and value is not None and value > bound:
            return False
    return True


def slo_attainment(records: Sequence[RequestRecord], bounds: SloBounds) -> float | None:
    """The share of the requests that meet every bound (failed requests count as missing it);
    None when there are no requests."""
    if not records:
        return None
    return sum(1 for r in records if request_meets(r, bounds)) / len(records)


@dataclass(frozen=True)
class RepeatOutcome:
    """One repeat of a rate: its SLO attainment (None when it has none: no requests), whether
    it passed the validity checks, how many requests it sent (required with an attainment:
    the decision counts them) and, when invalid, why."""

    attainment: float | None
    valid: bool
    requests: int | None = None
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        a = self.attainment
        if a is not None and not (_number(a) and 0 <= a <= 1):
            raise ServelabError(
                f"attainment {a!r} is not a share from 0 to 1: give the share of requests "
                "that met the SLO, or None when there were none"
            )
        n = self.requests
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
            raise ServelabError(f"requests {n!r}: give how many requests the repeat sent")
        if a is not None:
            if not n:
                raise ServelabError(
                    f"attainment {a!r} of {n!r} requests: give the number of requests the "
                    "attainment is a share of (the decision counts them)"
                )
            if abs(a * n - round(a * n)) > 1e-6:
                raise ServelabError(
                    f"attainment {a!r} of {n} requests is not a whole number of requests: give "
                    "the share of requests that met the SLO"
                )
        _floats(self, ("attainment",))
        object.__setattr__(self, "reasons", tuple(self.reasons))

    @property
    def over(self) -> int:
        """How many of its requests missed the SLO (0 without requests)."""
        a, n = self.attainment, self.requests
        if a is None or not n:
            return 0
        return n - round(a * n)

    @property
    def counted(self) -> int:
        """How many of its requests the decision counts (0 without an attainment)."""
        return 0 if self.attainment is None else self.requests or 0

    def to_json(self) -> RepeatJson:
        return {
            "attainment": self.attainment,
            "valid": self.valid,
            "requests": self.requests,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class RateOutcome:
    """A rate measured with the experiment's repeats, one RepeatOutcome each, in order (a
    round's, or every round's of a step)."""

    repeats: tuple[RepeatOutcome, ...]

    def decide(self, target: float, confidence: float = CONFIDENCE) -> Decision:
        """The early-stop decision over the requests of the valid repeats, pooled: meets,
        fails or undecided against the share 1 - `target` allowed to miss the SLO
        (servelab.analysis.early_stop.decide); undecided without a valid request."""
        valid = [r for r in self.repeats if r.valid]
        n = sum(r.counted for r in valid)
        k = sum(r.over for r in valid)
        return decide(n, k, allowed_share(target), confidence)


# measure(rate, round_): one round of the repeats at `rate` (round_ from 1)
Measure = Callable[[float, int], RateOutcome]


@dataclass(frozen=True)
class SearchSpec:
    """How to search: the first rate (`start_rate`, req/s); the `growth` factor of the
    bracketing (multiply while the rate meets, divide while it fails); the attainment `target`
    (share of requests within the `bounds`); the relative width of the bracket (failed / met
    - 1) at which bisection stops (`tolerance`); at most `max_measurements` rates measured; and
    the lowest and highest rates allowed (None: no limit). Every rate measured is a whole
    number of `resolution` req/s (None: any rate), as the raw layout names a rate's folder to
    the thousandth: two rates of a search never share a folder. A rate the early-stop rule
    leaves undecided is measured again, at most `max_rounds` rounds in all; `confidence` is
    the one-sided confidence of the rule's bounds."""

    start_rate: float
    bounds: SloBounds
    target: float = 0.99
    growth: float = 2.0
    tolerance: float = 0.05
    max_measurements: int = 12
    min_rate: float | None = None
    max_rate: float | None = None
    resolution: float | None = 0.001
    max_rounds: int = 3
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        _check_spec(self)
        names = ("start_rate", "target", "growth", "tolerance", "min_rate", "max_rate")
        _floats(self, (*names, "resolution", "confidence"))

    @property
    def allowed(self) -> float:
        """The share of a rate's requests allowed to miss the SLO: 1 - target."""
        return allowed_share(self.target)

    def snap(self, rate: float) -> float:
        """`rate` on the grid of the resolution (the nearest whole number of it), as recorded."""
        res = self.resolution
        return _digits(rate if res is None else round(rate / res) * res)

    @property
    def floor(self) -> float | None:
        """The lowest rate the search may measure: min_rate, else the resolution."""
        low = self.min_rate
        return low if low is not None else self.resolution

    def to_json(self) -> SpecJson:
        return {
            "start_rate": self.start_rate,
            "bounds": self.bounds.to_json(),
            "target": self.target,
            "growth": self.growth,
            "tolerance": self.tolerance,
            "max_measurements": self.max_measurements,
            "min_rate": self.min_rate,
            "max_rate": self.max_rate,
            "resolution": self.resolution,
            "max_rounds": self.max_rounds,
            "confidence": self.confidence,
        }


def _check_spec(s: SearchSpec) -> None:
    def bad(name: str, todo: str) -> ServelabError:
        return ServelabError(f"search {name} {getattr(s, name)!r}: {todo}")

    for name in ("resolution", "start_rate", "min_rate", "max_rate"):
        v = getattr(s, name)
        if (v is not None or name == "start_rate") and not (_number(v) and v > 0):
            raise bad(name, "give a rate in req/s above 0")
        if v is not None and name != "resolution" and s.snap(v) != _digits(v):
            raise bad(name, f"is not a whole number of the resolution {s.resolution!r} req/s")
    if not (_number(s.growth) and s.growth > 1):
        raise bad("growth", "give a factor above 1, e.g. 2")
    if not (_number(s.target) and 0 < s.target <= 1):
        raise bad("target", "give the share of requests to meet the SLO, above 0 and at most 1")
    if not (_number(s.tolerance) and s.tolerance > 0):
        raise bad("tolerance", "give the relative width to stop at, above 0, e.g. 0.05")
    m = s.max_measurements
    if not isinstance(m, int) or isinstance(m, bool) or m < 2:
        raise bad("max_measurements", "give a whole number from 2 up")
    r = s.max_rounds
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise bad("max_rounds", "give a whole number from 1 up")
    if not (_number(s.confidence) and 0 < s.confidence < 1):
        raise bad("confidence", "give a probability between 0 and 1, e.g. 0.95")
    low, high = s.min_rate, s.max_rate
    if low is not None and s.start_rate < low:
        raise bad("start_rate", f"below min_rate {low!r}: start within the limits")
    if high is not None and s.start_rate > high:
        raise bad("start_rate", f"above max_rate {high!r}: start within the limits")
    if not isinstance(s.bounds, SloBounds):
        raise bad("bounds", "give an SloBounds")


@dataclass(frozen=True)
class Step:
    """One measured rate of the search: its place in the path (`order`, from 1), its `phase`
    (bracket or bisect), the `rate`, its outcome (every repeat of its `rounds`, in order) and
    the early-stop decision over their pooled requests."""

    order: int
    phase: str
    rate: float
    outcome: RateOutcome
    decision: Decision
    rounds: int = 1

    @property
    def meets(self) -> bool:
        """Whether the rate met the SLO: only a decision of meets does (undecided never)."""
        return self.decision.decision == "meets"

    def to_json(self) -> StepJson:
        d = self.decision
        return {
            "order": self.order,
            "phase": self.phase,
            "rate": self.rate,
            "rounds": self.rounds,
            "repeats": [r.to_json() for r in self.outcome.repeats],
            "decision": d.decision,
            "requests": d.n,
            "over": d.k,
            "over_lower": d.lower,
            "over_upper": d.upper,
            "decision_text": d.text(),
        }


@dataclass(frozen=True)
class Answer:
    """The search's answer: `met_rate`, the highest rate that met the SLO, and `failed_rate`,
    the lowest rate above it that failed (either None when the path has none); why it stopped
    (`stopped`, one of STOPS); and, unless it converged, the `reason` in words and what to
    change (None for a bracket within the tolerance). `failed_rate` is the lowest rate that
    did not meet: one the early-stop rule left `undecided` (those rates, in path order) counts
    as not meeting, never as a pass."""

    met_rate: float | None
    failed_rate: float | None
    stopped: str
    reason: str | None
    undecided: tuple[float, ...] = ()

    @property
    def bracket(self) -> tuple[float, float] | None:
        """(met_rate, failed_rate), None when either is missing."""
        met, failed = self.met_rate, self.failed_rate
        if met is None or failed is None:
            return None
        return (met, failed)

    @property
    def relative_width(self) -> float | None:
        """failed_rate / met_rate - 1, None without a bracket."""
        b = self.bracket
        return None if b is None else b[1] / b[0] - 1

    def text(self) -> str:
        """The answer in words: "between 3.5 and 3.75 req/s", or what is known instead; the
        undecided rates after it, e.g. "between 3.5 and 3.75 req/s (undecided, counted as not
        meeting: 3.75 req/s)"."""
        b = self.bracket
        met, failed = self.met_rate, self.failed_rate
        if b is not None:
            said = f"between {b[0]:g} and {b[1]:g} req/s"
        elif met is not None:
            said = f"at least {met:g} req/s ({self.reason})"
        elif failed is not None:
            said = f"below {failed:g} req/s ({self.reason})"
        else:
            said = f"unknown ({self.reason})"
        if self.undecided:
            rates = ", ".join(f"{r:g}" for r in self.undecided)
            said += f" (undecided, counted as not meeting: {rates} req/s)"
        return said

    def to_json(self) -> AnswerJson:
        return {
            "met_rate": self.met_rate,
            "failed_rate": self.failed_rate,
            "relative_width": self.relative_width,
            "stopped": self.stopped,
            "reason": self.reason,
            "undecided_rates": list(self.undecided),
            "text": self.text(),
        }


@dataclass(frozen=True)
class SearchResult:
    """A finished search: its spec, its path (every measured rate, in order) and its answer."""

    spec: SearchSpec
    path: tuple[Step, ...]
    answer: Answer

    def to_json(self) -> SearchJson:
        """search.json's document."""
        return {
            "format_version": FORMAT_VERSION,
            "spec": self.spec.to_json(),
            "path": [s.to_json() for s in self.path],
            "answer": self.answer.to_json(),
        }


@dataclass
class _Walk:
    """The search under way: the path so far and the bracket it holds."""

    measure: Measure
    spec: SearchSpec
    steps: list[Step] = field(default_factory=list)
    met: float | None = None  # highest rate that met, below every rate that did not
    failed: float | None = None  # lowest rate that did not meet (failed or undecided)

    def step(self, phase: str, rate: float) -> bool:
        """Measure `rate`, round after round while the decision is undecided (at most
        max_rounds), and add it to the path; whether it met."""
        repeats: tuple[RepeatOutcome, ...] = ()
        for round_ in range(1, self.spec.max_rounds + 1):
            outcome = self.measure(rate, round_)
            if not isinstance(outcome, RateOutcome):
                name = type(outcome).__name__
                raise TypeError(f"measure({rate!r}, {round_}) gave {name}: give a RateOutcome")
            repeats += outcome.repeats
            decision = RateOutcome(repeats).decide(self.spec.target, self.spec.confidence)
            if decision.decision != "undecided":
                break
        step = Step(len(self.steps) + 1, phase, rate, RateOutcome(repeats), decision, round_)
        self.steps.append(step)
        if step.meets:
            self.met = rate
        else:
            self.failed = rate
        return step.meets

    @property
    def spent(self) -> bool:
        return len(self.steps) >= self.spec.max_measurements

    def answer(self, stopped: str, reason: str | None) -> SearchResult:
        undecided = tuple(s.rate for s in self.steps if s.decision.decision == "undecided")
        a = Answer(self.met, self.failed, stopped, reason, undecided)
        return SearchResult(self.spec, tuple(self.steps), a)


def search_rate(measure: Measure, spec: SearchSpec) -> SearchResult:
    """Search for the highest rate that meets the SLO, measuring rates with `measure`.

    Each rate is measured a round at a time, `measure(rate, round_)`, until the early-stop
    decision over its rounds so far is meets or fails, or `max_rounds` rounds leave it
    undecided, which counts as not meeting ("fails" below: does not meet). Bracketing:
    measure `start_rate`; while the rate meets, multiply it by `growth` (capped at `max_rate`)
    until one fails; if the start fails, divide by `growth` (floored at `min_rate`, else the
    resolution) until one meets. Bisection: measure the midpoint of the bracket
    (met + failed) / 2, which replaces the end on its side, until failed / met - 1 <=
    `tolerance`, or until no rate of the resolution's grid lies inside the bracket. Every rate
    is snapped to that grid, and the bracketing moves by at least one step of it; no rate is
    a step twice. At most `max_measurements` rates are measured in all; a search that runs
    out keeps what it found (stopped: max_measurements)."""
    w = _Walk(measure, spec)
    start = spec.snap(spec.start_rate)
    if w.step("bracket", start):
        stop = _bracket_up(w, start)
    else:
        stop = _bracket_down(w, start)
    if stop is not None:
        return stop
    while True:
        assert w.met is not None and w.failed is not None
        if w.failed / w.met - 1 <= spec.tolerance:
            return w.answer("converged", None)
        if w.spent:
            return w.answer(
                "max_measurements",
                f"the bracket is still wider than the tolerance {spec.tolerance:g} after "
                f"{len(w.steps)} measurements: raise max_measurements or the tolerance",
            )
        mid = spec.snap((w.met + w.failed) / 2)
        if not w.met < mid < w.failed:
            return w.answer(
                "resolution",
                f"no rate on the grid of the resolution {spec.resolution!r} req/s lies inside "
                "the bracket: lower the resolution or raise the tolerance",
            )
        w.step("bisect", mid)


def _bracket_up(w: _Walk, rate: float) -> SearchResult | None:
    """From a rate that met: grow until one fails (None: bracketed), or stop at max_rate or
    the budget."""
    top = w.spec.max_rate
    while True:
        if top is not None and rate >= top:
            return w.answer(
                "max_rate",
                f"the highest allowed rate {top:g} req/s still meets the SLO: raise max_rate",
            )
        if w.spent:
            return w.answer(
                "max_measurements",
                f"every rate measured met the SLO, up to {rate:g} req/s, after "
                f"{len(w.steps)} measurements: raise start_rate, growth or max_measurements",
            )
        up = max(w.spec.snap(rate * w.spec.growth), w.spec.snap(rate + (w.spec.resolution or 0)))
        rate = up if top is None else min(up, top)
        if not w.step("bracket", rate):
            return None


def _bracket_down(w: _Walk, rate: float) -> SearchResult | None:
    """From a rate that failed: shrink until one meets (None: bracketed), or stop at min_rate
    or the budget."""
    low = w.spec.floor
    while True:
        if low is not None and rate <= low:
            return w.answer(
                "min_rate",
                f"even the lowest allowed rate {low:g} req/s does not meet the SLO: lower min_rate "
                "or the resolution, or relax the SLO",
            )
        if w.spent:
            return w.answer(
                "max_measurements",
                f"no rate measured met the SLO, down to {rate:g} req/s, after "
                f"{len(w.steps)} measurements: lower start_rate or raise max_measurements",
            )
        down = min(w.spec.snap(rate / w.spec.growth), w.spec.snap(rate - (w.spec.resolution or 0)))
        rate = down if low is None else max(down, low)
        if w.step("bracket", rate):
            return None
