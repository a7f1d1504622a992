"""SLO capacity by search (servelab.analysis.search): bracketing and bisection on synthetic outcomes with a
known threshold, the rule for a rate that meets the SLO, attainment from request records,
search.json's writer and checked reader, the figure's bytes; and the known answer: against a
server of known capacity (tests/queue_server.py), a real open loop finds that capacity within
one bisection step."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servelab.analysis.search import (
    Answer,
    RateOutcome,
    RepeatOutcome,
    SearchResult,
    SearchSpec,
    SloBounds,
    read_search,
    request_meets,
    search_rate,
    slo_attainment,
    write_search,
)
from servelab.analysis.search_figure import render_search
from servelab.client import RequestRecord
from servelab.errors import ServelabError
from servelab.store.jsonio import dumps

E2EL = SloBounds(e2el_ms=100)


def rep(attainment: float | None, valid: bool = True) -> RepeatOutcome:
    return RepeatOutcome(attainment, valid, 100)


def threshold(t: float, repeats: int = 1) -> Callable[[float], RateOutcome]:
    """A server that meets the SLO up to rate `t` and misses it above."""

    def measure(rate: float) -> RateOutcome:
        return RateOutcome(tuple(rep(1.0 if rate <= t else 0.5) for _ in range(repeats)))

    return measure


class Recorder:
    """A measure that remembers the rates it was asked for."""

    def __init__(self, inner: Callable[[float], RateOutcome]) -> None:
        self.inner = inner
        self.rates: list[float] = []

    def __call__(self, rate: float) -> RateOutcome:
        self.rates.append(rate)
        return self.inner(rate)


def spec(start: float, **kw: Any) -> SearchSpec:
    return SearchSpec(start_rate=start, bounds=E2EL, **kw)


# --- bracketing and bisection ---------------------------------------------------------------


def test_the_path_of_a_known_search() -> None:
    """Start 2, double: 2 meets, 4 fails; bisect 3, 3.5 (meet), 3.75 (fails): 3.75 / 3.5 - 1 =
    7% > 5%, so 3.625 (meets): 3.4%, done."""
    m = Recorder(threshold(3.7))
    r = search_rate(m, spec(2, target=0.99))
    assert m.rates == [2, 4, 3, 3.5, 3.75, 3.625]
    assert [(s.order, s.phase, s.rate, s.meets) for s in r.path] == [
        (1, "bracket", 2, True),
        (2, "bracket", 4, False),
        (3, "bisect", 3, True),
        (4, "bisect", 3.5, True),
        (5, "bisect", 3.75, False),
        (6, "bisect", 3.625, True),
    ]
    assert r.answer == Answer(3.625, 3.75, "converged", None)
    assert r.answer.text() == "between 3.625 and 3.75 req/s"
    wide = search_rate(threshold(3.7), spec(2, tolerance=0.1))
    assert wide.answer.text() == "between 3.5 and 3.75 req/s"
    assert len(wide.path) == 5


@pytest.mark.parametrize("t", [0.013, 0.7, 1.0, 3.7, 9.99, 10.0, 10.01, 47.0, 1234.5])
@pytest.mark.parametrize("start", [0.5, 10.0, 300.0])
@pytest.mark.parametrize("tolerance", [0.01, 0.05, 0.25])
@pytest.mark.parametrize("resolution", [0.001, None])
def test_the_bracket_holds_the_threshold_and_is_one_step_wide(
    t: float, start: float, tolerance: float, resolution: float | None
) -> None:
    """From a start below or above the threshold: the answer's bracket holds it, is at most the
    tolerance wide (or, where the rates' grid is coarser, one grid step), and the bracket
    before the last bisection step was wider (no step wasted)."""
    s = spec(start, tolerance=tolerance, max_measurements=40, resolution=resolution)
    r = search_rate(threshold(t), s)
    a = r.answer
    assert a.bracket is not None, a
    lo, hi = a.bracket
    assert lo <= t < hi
    if a.stopped == "resolution":
        assert resolution is not None and hi - lo == pytest.approx(resolution), a
    else:
        assert a.stopped == "converged" and hi / lo - 1 <= tolerance, a
    assert len({s.rate for s in r.path}) == len(r.path)  # no rate measured twice
    if resolution is not None:  # every rate on the grid: a folder of its own, to the 0.001
        folders = {f"{s.rate:08.3f}" for s in r.path}
        assert len(folders) == len(r.path)
        assert all(s.rate == round(round(s.rate / resolution) * resolution, 9) for s in r.path)
    phases = [s.phase for s in r.path]
    assert phases == sorted(phases, key=lambda p: p == "bisect")  # bracketing, then bisection
    if phases[-1] == "bisect":
        prev = r.path[:-1]
        p_lo = max(s.rate for s in prev if s.meets)
        p_hi = min(s.rate for s in prev if not s.meets)
        assert p_hi / p_lo - 1 > tolerance
    bracket = [s for s in r.path if s.phase == "bracket"]
    direction = bracket[0].meets
    assert all(s.meets == direction for s in bracket[:-1]) and bracket[-1].meets != direction


def test_a_start_that_fails_divides_down() -> None:
    m = Recorder(threshold(3.0))
    r = search_rate(m, spec(40, growth=4, tolerance=0.3))
    assert m.rates[:3] == [40, 10, 2.5]
    assert [s.phase for s in r.path[:3]] == ["bracket"] * 3
    assert r.answer.met_rate is not None and r.answer.met_rate <= 3.0 < r.answer.failed_rate  # type: ignore[operator]


def test_the_rate_limits_cap_the_bracketing() -> None:
    m = Recorder(threshold(25))
    r = search_rate(m, spec(4, max_rate=20))
    assert m.rates == [4, 8, 16, 20]
    assert r.answer == Answer(
        20,
        None,
        "max_rate",
        "the highest allowed rate 20 req/s still meets the SLO: raise max_rate",
    )
    assert r.answer.bracket is None and r.answer.relative_width is None
    assert r.answer.text().startswith("at least 20 req/s (the highest allowed rate")

    m = Recorder(threshold(0.1))
    r = search_rate(m, spec(4, min_rate=0.3))
    assert m.rates == [4, 2, 1, 0.5, 0.3]
    assert (r.answer.met_rate, r.answer.failed_rate, r.answer.stopped) == (None, 0.3, "min_rate")
    assert r.answer.text() == (
        "below 0.3 req/s (even the lowest allowed rate 0.3 req/s fails the SLO: lower min_rate "
        "or the resolution, or relax the SLO)"
    )
    # without min_rate, the resolution is the floor
    r = search_rate(threshold(0.0001), spec(0.004))
    assert [s.rate for s in r.path] == [0.004, 0.002, 0.001] and r.answer.stopped == "min_rate"


def test_a_start_at_a_limit_stops_at_once() -> None:
    r = search_rate(threshold(9), spec(5, max_rate=5))
    assert [s.rate for s in r.path] == [5] and r.answer.stopped == "max_rate"
    r = search_rate(threshold(1), spec(5, min_rate=5))
    assert [s.rate for s in r.path] == [5] and r.answer.stopped == "min_rate"


def test_the_budget_stops_the_search_with_what_it_found() -> None:
    r = search_rate(threshold(1000), spec(1, max_measurements=3))
    assert [s.rate for s in r.path] == [1, 2, 4]
    assert (r.answer.met_rate, r.answer.failed_rate, r.answer.stopped) == (
        4,
        None,
        "max_measurements",
    )
    assert "every rate measured met the SLO, up to 4 req/s, after 3 measurements" in r.answer.text()

    r = search_rate(threshold(0.001), spec(1, max_measurements=2))
    assert (r.answer.met_rate, r.answer.failed_rate) == (None, 0.5)
    assert "every rate measured failed the SLO, down to 0.5 req/s" in str(r.answer.reason)

    r = search_rate(threshold(3.7), spec(2, max_measurements=4))
    assert r.answer.bracket == (3.5, 4) and r.answer.stopped == "max_measurements"
    assert r.answer.text() == "between 3.5 and 4 req/s"
    assert "still wider than the tolerance 0.05 after 4 measurements" in str(r.answer.reason)


def test_a_bracket_narrower_than_the_grid_stops_at_the_grid() -> None:
    r = search_rate(threshold(3.7), spec(2, tolerance=0.001, resolution=0.25))
    assert [s.rate for s in r.path] == [2, 4, 3, 3.5, 3.75]
    assert r.answer.bracket == (3.5, 3.75) and r.answer.stopped == "resolution"
    assert r.answer.text() == "between 3.5 and 3.75 req/s"
    # the bracketing always moves by at least one grid step
    m = Recorder(threshold(3.7))
    search_rate(m, spec(1, growth=1.1, resolution=1, max_measurements=5))
    assert m.rates == [1, 2, 3, 4]  # then no whole rate lies between 3 and 4


def test_same_outcomes_same_path() -> None:
    a = search_rate(threshold(7.3, repeats=3), spec(1.7, growth=3, tolerance=0.02))
    b = search_rate(threshold(7.3, repeats=3), spec(1.7, growth=3, tolerance=0.02))
    assert a == b and dumps(a.to_json()) == dumps(b.to_json())


def test_outcomes_that_are_not_monotone_keep_the_bracket_conservative() -> None:
    """A noisy server that should meet the SLO up to 9 req/s fails it at 6 and 4.5 by chance:
    the search never goes back above the lowest failure, so every rate that met lies below
    every rate that failed and the answer errs low."""
    answers = {1.5: True, 3: True, 6: False, 4.5: False, 3.75: True, 4.125: True}
    r = search_rate(
        lambda x: RateOutcome((rep(1.0 if answers[x] else 0.0),)), spec(1.5, tolerance=0.1)
    )
    assert [s.rate for s in r.path] == list(answers)
    assert r.answer.bracket == (4.125, 4.5)
    assert max(s.rate for s in r.path if s.meets) < min(s.rate for s in r.path if not s.meets)


# --- the rule for a rate that meets ---------------------------------------------------------


@pytest.mark.parametrize(
    ("repeats", "meets"),
    [
        ((rep(0.99), rep(1.0)), True),
        ((rep(0.99), rep(0.989)), False),  # one valid repeat below the target fails the rate
        ((rep(1.0), rep(0.2, valid=False)), True),  # an invalid repeat is left out
        ((rep(0.2, valid=False),), False),  # no valid repeat: never meets
        ((), False),
        ((rep(None),), False),  # a valid repeat without requests does not meet
    ],
)
def test_a_rate_meets_when_every_valid_repeat_does(
    repeats: tuple[RepeatOutcome, ...], meets: bool
) -> None:
    assert RateOutcome(repeats).meets(0.99) is meets


def record(ttft_us: int, done_us: int, tokens: int = 5, ok: bool = True) -> RequestRecord:
    chunks = [ttft_us + i * (done_us - ttft_us) // max(1, tokens - 1) for i in range(tokens)]
    return RequestRecord("r", 0, chunks, done_us, 3, tokens, ok)


def test_attainment_counts_requests_within_every_bound() -> None:
    b = SloBounds(ttft_ms=50, tpot_ms=10)
    fast = record(40_000, 70_000)  # TTFT 40 ms, TPOT (70 - 40) / 4 = 7.5 ms
    slow_first = record(60_000, 80_000)
    slow_tokens = record(20_000, 80_000)  # TPOT 15 ms
    failed = RequestRecord("r", 0, [], None, ok=False, error="boom")
    one_token = record(45_000, 900_000, tokens=1)  # no TPOT: that bound does not apply
    assert [request_meets(r, b) for r in (fast, slow_first, slow_tokens, failed, one_token)] == [
        True,
        False,
        False,
        False,
        True,
    ]
    assert slo_attainment([fast, slow_first, slow_tokens, failed, one_token], b) == 0.4
    assert slo_attainment([], b) is None
    assert slo_attainment([fast, one_token], SloBounds(e2el_ms=100)) == 0.5
    assert request_meets(record(40_000, 100_000), SloBounds(e2el_ms=100))  # at the bound: in


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"start_rate": 0}, r"^search start_rate 0: give a rate in req/s above 0$"),
        ({"growth": 1}, r"^search growth 1: give a factor above 1, e.g. 2$"),
        ({"target": 1.5}, r"^search target 1.5: give the share of requests"),
        ({"tolerance": 0}, r"^search tolerance 0: give the relative width"),
        ({"max_measurements": 1}, r"^search max_measurements 1: give a whole number from 2 up$"),
        ({"min_rate": 5}, r"^search start_rate 2: below min_rate 5: start within the limits$"),
        ({"max_rate": 1}, r"^search start_rate 2: above max_rate 1: start within the limits$"),
        ({"min_rate": math.nan}, r"^search min_rate nan: give a rate"),
        ({"resolution": 0}, r"^search resolution 0: give a rate in req/s above 0$"),
        ({"start_rate": 2.0005}, r"^search start_rate 2.0005: is not a whole number of the "),
        ({"max_rate": 7.5, "resolution": 1}, r"^search max_rate 7.5: is not a whole number"),
    ],
)
def test_invalid_specs(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ServelabError, match=match):
        SearchSpec(**{"start_rate": 2, "bounds": E2EL, **kw})


def test_invalid_bounds() -> None:
    with pytest.raises(ServelabError, match=r"^an SLO with no bound: set at least one of"):
        SloBounds()
    with pytest.raises(ServelabError, match=r"^SLO bound tpot_ms -1 is not a number above 0"):
        SloBounds(tpot_ms=-1)


def test_a_measure_must_give_a_rate_outcome() -> None:
    with pytest.raises(TypeError, match=r"^measure\(2.0\) gave float: give a RateOutcome$"):
        search_rate(lambda r: 1.0, spec(2.0))  # type: ignore[arg-type,return-value]


# --- search.json ----------------------------------------------------------------------------


def example() -> SearchResult:
    def measure(rate: float) -> RateOutcome:
        ok = rate <= 3.7
        return RateOutcome(
            (
                RepeatOutcome(1.0 if ok else 0.8, True, 120),
                RepeatOutcome(0.995 if ok else 0.7, rate != 4, 120, () if rate != 4 else ("slip",)),
            )
        )

    return search_rate(measure, SearchSpec(2, SloBounds(ttft_ms=500, tpot_ms=50), target=0.99))


def test_search_json_reads_back_to_the_same_result_and_bytes(tmp_path: Path) -> None:
    r = example()
    path = tmp_path / "search.json"
    write_search(path, r)
    first = path.read_bytes()
    back = read_search(path)
    assert back == r
    write_search(path, back)
    assert path.read_bytes() == first
    doc = json.loads(first)
    assert list(doc) == ["answer", "format_version", "path", "spec"]
    assert doc["answer"]["text"] == "between 3.625 and 3.75 req/s"
    assert doc["path"][1]["repeats"][1] == {
        "attainment": 0.7,
        "valid": False,
        "requests": 120,
        "reasons": ["slip"],
    }


def damage(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    doc = example().to_json()
    edit(doc)
    path = tmp_path / "search.json"
    path.write_text(json.dumps(doc))
    return path


def _set(keys: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        node: Any = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return edit


def _drop(keys: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        node: Any = doc
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop(("answer",)), "$.answer: required field missing (schema search.schema.json)"),
        (_drop(("path", 2, "rate")), "$.path[2].rate: required field missing"),
        (_set(("path", 0, "phase"), "guess"), "$.path[0].phase: 'guess' is not one of"),
        (_set(("path", 1, "repeats", 0, "attainment"), "0.8"), "$.path[1].repeats[0].attainment:"),
        (_set(("spec", "growth"), 1), "$.spec.growth: 1 is less than or equal to the minimum of 1"),
        (_set(("path",), []), "$.path: [] should be non-empty"),
        (_set(("format_version",), 2), "$.format_version: 2 is not a version this servelab reads"),
        (_drop(("format_version",)), "$.format_version: required field missing"),
        (
            _set(("spec", "max_rate"), 1.5),
            "$.spec.start_rate: 2.0: above max_rate 1.5: start within",
        ),
        (_set(("path", 3, "order"), 7), "$.path[3].order: 7, where 4 follows the steps before it"),
        (_set(("path", 0, "meets"), False), "$.path[0].meets: False, where its repeats and the"),
        (_set(("answer", "met_rate"), 3.5), "$.answer.met_rate: 3.5, where the path says 3.625"),
        (_set(("answer", "failed_rate"), None), "$.answer.failed_rate: None, where the path says"),
    ],
)
def test_damaged_search_json_is_one_line_naming_file_and_field(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = damage(tmp_path, edit)
    with pytest.raises(ServelabError) as info:
        read_search(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    assert message in text, text
    assert text.endswith("re-run the search")


def test_a_file_that_is_not_a_search(tmp_path: Path) -> None:
    path = tmp_path / "search.json"
    path.write_text("[1, 2")
    with pytest.raises(
        ServelabError, match=r"search.json: \$: not valid JSON .*re-run the search$"
    ):
        read_search(path)
    path.write_text("[1, 2]")
    with pytest.raises(ServelabError, match=r"search.json: \$: a list, not a JSON object"):
        read_search(path)
    with pytest.raises(ServelabError, match=r"nowhere.json: file not found$"):
        read_search(tmp_path / "nowhere.json")


# --- the figure -----------------------------------------------------------------------------


def test_the_search_figure_is_the_same_bytes_each_time(tmp_path: Path) -> None:
    r = example()
    a = render_search(r, tmp_path / "a")
    b = render_search(r, tmp_path / "b")
    assert [p.name for p in a] == ["search_path.svg", "search_path.png"]
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes()
    svg = a[0].read_text()
    assert "between 3.625 and 3.75 req/s" in svg and "final bracket" in svg
    # a search without a bracket draws too
    edge = search_rate(threshold(25), spec(4, max_rate=20))
    assert [p.name for p in render_search(edge, tmp_path / "c", "edge")] == ["edge.svg", "edge.png"]
