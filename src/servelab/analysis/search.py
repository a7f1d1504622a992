"""SLO capacity by search: the highest request rate whose SLO attainment stays at or above a
target, found by bracketing then bisection on measured rates (docs/analysis.md, "SLO capacity
by search").

The search is a pure driver over a callable: `search_rate(measure, spec)` asks `measure(rate)`
for the outcome of one rate (each repeat's SLO attainment and whether the repeat was valid) and
decides from those outcomes alone which rate to measure next. The same outcomes give the same
path, step for step. `slo_attainment` is a repeat's attainment from its request records;
`write_search` / `read_search` are search.json's one writer and its checked reader.

A rate **meets** the SLO when at least one of its repeats is valid and every valid repeat's
attainment is at or above the target (`RateOutcome.meets`). Invalid repeats are left out (as
the analysis leaves out invalid points), but a rate with no valid repeat never meets.

The answer is a bracket: the highest rate that met and the lowest rate above it that failed
("between 3.5 and 3.75 req/s"). Every rate that met lies below every rate that failed on the
path, so the bracket holds every crossing the measurements saw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from servelab.store.jsonio import json_path, load_schema, write_json
from servelab.store.records import DamagedRawData, read_raw

__all__ = [
    "FORMAT_VERSION",
    "SEARCH_FILE",
    "STOPS",
    "Answer",
    "RateOutcome",
    "RepeatOutcome",
    "SearchResult",
    "SearchSpec",
    "SloBounds",
    "Step",
    "read_search",
    "request_meets",
    "search_from_json",
    "search_rate",
    "slo_attainment",
    "write_search",
]

SEARCH_FILE = paths.SEARCH_FILE
FORMAT_VERSION = 1
# why a search stopped (Answer.stopped)
STOPS = ("converged", "resolution", "max_measurements", "min_rate", "max_rate")
_TODO = "re-run the search"


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
    it passed the validity checks, how many requests it sent and, when invalid, why."""

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
        _floats(self, ("attainment",))
        object.__setattr__(self, "reasons", tuple(self.reasons))

    def to_json(self) -> RepeatJson:
        return {
            "attainment": self.attainment,
            "valid": self.valid,
            "requests": self.requests,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class RateOutcome:
    """A rate measured with the experiment's repeats, one RepeatOutcome each, in order."""

    repeats: tuple[RepeatOutcome, ...]

    def meets(self, target: float) -> bool:
        """At least one valid repeat, and every valid repeat's attainment >= `target` (a valid
        repeat without an attainment does not meet)."""
        valid = [r for r in self.repeats if r.valid]
        return bool(valid) and all(
            r.attainment is not None and r.attainment >= target for r in valid
        )


@dataclass(frozen=True)
class SearchSpec:
    """How to search: the first rate (`start_rate`, req/s); the `growth` factor of the
    bracketing (multiply while the rate meets, divide while it fails); the attainment `target`
    (share of requests within the `bounds`); the relative width of the bracket (failed / met
    - 1) at which bisection stops (`tolerance`); at most `max_measurements` rates measured; and
    the lowest and highest rates allowed (None: no limit). Every rate measured is a whole
    number of `resolution` req/s (None: any rate), as the raw layout names a rate's folder to
    the thousandth: two rates of a search never share a folder."""

    start_rate: float
    bounds: SloBounds
    target: float = 0.99
    growth: float = 2.0
    tolerance: float = 0.05
    max_measurements: int = 12
    min_rate: float | None = None
    max_rate: float | None = None
    resolution: float | None = 0.001

    def __post_init__(self) -> None:
        _check_spec(self)
        names = ("start_rate", "target", "growth", "tolerance", "min_rate", "max_rate")
        _floats(self, (*names, "resolution"))

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
    (bracket or bisect), the `rate`, its outcome and whether it met the SLO."""

    order: int
    phase: str
    rate: float
    outcome: RateOutcome
    meets: bool

    def to_json(self) -> StepJson:
        return {
            "order": self.order,
            "phase": self.phase,
            "rate": self.rate,
            "repeats": [r.to_json() for r in self.outcome.repeats],
            "meets": self.meets,
        }


@dataclass(frozen=True)
class Answer:
    """The search's answer: `met_rate`, the highest rate that met the SLO, and `failed_rate`,
    the lowest rate above it that failed (either None when the path has none); why it stopped
    (`stopped`, one of STOPS); and, unless it converged, the `reason` in words and what to
    change (None for a bracket within the tolerance)."""

    met_rate: float | None
    failed_rate: float | None
    stopped: str
    reason: str | None

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
        """The answer in words: "between 3.5 and 3.75 req/s", or what is known instead."""
        b = self.bracket
        if b is not None:
            return f"between {b[0]:g} and {b[1]:g} req/s"
        met, failed = self.met_rate, self.failed_rate
        if met is not None:
            return f"at least {met:g} req/s ({self.reason})"
        if failed is not None:
            return f"below {failed:g} req/s ({self.reason})"
        return f"unknown ({self.reason})"

    def to_json(self) -> AnswerJson:
        return {
            "met_rate": self.met_rate,
            "failed_rate": self.failed_rate,
            "relative_width": self.relative_width,
            "stopped": self.stopped,
            "reason": self.reason,
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

    measure: Callable[[float], RateOutcome]
    spec: SearchSpec
    steps: list[Step] = field(default_factory=list)
    met: float | None = None  # highest rate that met, below every rate that failed
    failed: float | None = None  # lowest rate that failed

    def step(self, phase: str, rate: float) -> bool:
        outcome = self.measure(rate)
        if not isinstance(outcome, RateOutcome):
            raise TypeError(f"measure({rate!r}) gave {type(outcome).__name__}: give a RateOutcome")
        meets = outcome.meets(self.spec.target)
        self.steps.append(Step(len(self.steps) + 1, phase, rate, outcome, meets))
        if meets:
            self.met = rate
        else:
            self.failed = rate
        return meets

    @property
    def spent(self) -> bool:
        return len(self.steps) >= self.spec.max_measurements

    def answer(self, stopped: str, reason: str | None) -> SearchResult:
        a = Answer(self.met, self.failed, stopped, reason)
        return SearchResult(self.spec, tuple(self.steps), a)


def search_rate(measure: Callable[[float], RateOutcome], spec: SearchSpec) -> SearchResult:
    """Search for the highest rate that meets the SLO, measuring rates with `measure`.

    Bracketing: measure `start_rate`; while the rate meets, multiply it by `growth` (capped at
    `max_rate`) until one fails; if the start fails, divide by `growth` (floored at `min_rate`,
    else the resolution) until one meets. Bisection: measure the midpoint of the bracket
    (met + failed) / 2, which replaces the end on its side, until failed / met - 1 <=
    `tolerance`, or until no rate of the resolution's grid lies inside the bracket. Every rate
    is snapped to that grid, and the bracketing moves by at least one step of it; no rate is
    measured twice. At most `max_measurements` rates are measured in all; a search that runs
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
                f"even the lowest allowed rate {low:g} req/s fails the SLO: lower min_rate "
                "or the resolution, or relax the SLO",
            )
        if w.spent:
            return w.answer(
                "max_measurements",
                f"every rate measured failed the SLO, down to {rate:g} req/s, after "
                f"{len(w.steps)} measurements: lower start_rate or raise max_measurements",
            )
        down = min(w.spec.snap(rate / w.spec.growth), w.spec.snap(rate - (w.spec.resolution or 0)))
        rate = down if low is None else max(down, low)
        if w.step("bracket", rate):
            return None


# --- search.json ------------------------------------------------------------------------------


def write_search(path: Path, result: SearchResult) -> None:
    """Write search.json (same result, same bytes)."""
    write_json(path, result.to_json())


@functools.cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema("search"))


def read_search(path: Path) -> SearchResult:
    """The search in search.json at `path`, checked: against its schema (every field it
    requires, at every depth), then that it is the format version this servelab reads, that its
    spec is a valid one, that its steps are numbered from 1 in order with `meets` as the rule
    and the target say, and that the answer is the path's. Damage raises DamagedRawData (a
    ServelabError): one line naming the file and the field."""
    return search_from_json(read_raw(path, _TODO), path)


def search_from_json(doc: Any, path: Path) -> SearchResult:
    """The search of a search.json document read from `path`, checked as `read_search` says."""
    version = doc.get("format_version", FORMAT_VERSION) if isinstance(doc, dict) else None
    if version != FORMAT_VERSION and version is not None:
        what = f"{version!r} is not a version this servelab reads ({FORMAT_VERSION})"
        raise DamagedRawData(
            path, "$.format_version", what, "upgrade servelab or re-run the search"
        )
    _check_schema(doc, path)
    spec = _spec_of(doc["spec"], path)
    steps = []
    for i, s in enumerate(doc["path"]):
        where = f"$.path[{i}]"
        if s["order"] != i + 1:
            what = f"{s['order']!r}, where {i + 1} follows the steps before it"
            raise DamagedRawData(path, f"{where}.order", what, _TODO)
        repeats = tuple(
            RepeatOutcome(r["attainment"], r["valid"], r["requests"], tuple(r["reasons"]))
            for r in s["repeats"]
        )
        outcome = RateOutcome(repeats)
        if outcome.meets(spec.target) != s["meets"]:
            what = f"{s['meets']!r}, where its repeats and the target {spec.target:g} say otherwise"
            raise DamagedRawData(path, f"{where}.meets", what, _TODO)
        steps.append(Step(s["order"], s["phase"], float(s["rate"]), outcome, s["meets"]))
    return SearchResult(spec, tuple(steps), _answer_of(doc["answer"], steps, path))


def _check_schema(doc: Any, path: Path) -> None:
    if not isinstance(doc, dict):
        raise DamagedRawData(path, "$", f"a {type(doc).__name__}, not a JSON object", _TODO)
    errors = []
    for err in _validator().iter_errors(doc):
        where, what = json_path(err.absolute_path), err.message
        if err.validator == "required" and isinstance(err.instance, dict):
            missing = [k for k in err.validator_value if k not in err.instance]
            if missing:
                where, what = f"{where}.{missing[0]}", "required field missing"
        errors.append((where, what))
    if errors:
        where, what = min(errors)
        raise DamagedRawData(path, where, f"{what} (schema search.schema.json)", _TODO)


def _answer_of(a: AnswerJson, steps: Sequence[Step], path: Path) -> Answer:
    """The answer of a search.json, which must be its path's: the highest rate that met and the
    lowest that failed."""
    answer = Answer(
        _opt_float(a["met_rate"]), _opt_float(a["failed_rate"]), a["stopped"], a["reason"]
    )
    met = max((s.rate for s in steps if s.meets), default=None)
    failed = min((s.rate for s in steps if not s.meets), default=None)
    for name, want, given in (
        ("met_rate", met, a["met_rate"]),
        ("failed_rate", failed, a["failed_rate"]),
    ):
        if getattr(answer, name) != want:
            what = f"{given!r}, where the path says {want!r}"
            raise DamagedRawData(path, f"$.answer.{name}", what, _TODO)
    return answer


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _spec_of(d: SpecJson, path: Path) -> SearchSpec:
    """The spec of a search.json, valid (DamagedRawData naming the field otherwise)."""
    b = d["bounds"]
    try:
        bounds = SloBounds(
            _opt_float(b["ttft_ms"]), _opt_float(b["tpot_ms"]), _opt_float(b["e2el_ms"])
        )
    except ServelabError as exc:
        raise DamagedRawData(path, "$.spec.bounds", str(exc), _TODO) from None
    try:
        return SearchSpec(
            start_rate=float(d["start_rate"]),
            bounds=bounds,
            target=float(d["target"]),
            growth=float(d["growth"]),
            tolerance=float(d["tolerance"]),
            max_measurements=d["max_measurements"],
            min_rate=_opt_float(d["min_rate"]),
            max_rate=_opt_float(d["max_rate"]),
            resolution=_opt_float(d["resolution"]),
        )
    except ServelabError as exc:
        _, name, what = str(exc).split(" ", 2)  # "search <field> <value>: ..."
        raise DamagedRawData(path, f"$.spec.{name}", what, _TODO) from None
