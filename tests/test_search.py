"""SLO capacity by search (servelab.analysis.search): bracketing and bisection on synthetic outcomes with a
known threshold, the early-stop rule for a rate (pooled repeats; an undecided rate measured
again, round after round, and never a pass), attainment from request records, search.json's
writer and checked reader, the figure's bytes. The known answer against a server of known
capacity is tests/test_search_known.py."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servelab.analysis.search import (
    Answer,
    Measure,
    RateOutcome,
    RepeatOutcome,
    SearchResult,
    SearchSpec,
    SloBounds,
    request_meets,
    search_rate,
    slo_attainment,
)
from servelab.analysis.search_figure import render_search
from servelab.analysis.search_records import read_search, write_search
from servelab.client import RequestRecord
from servelab.errors import ServelabError
from servelab.store.jsonio import dumps

E2EL = SloBounds(e2el_ms=100)


def rep(attainment: float | None, valid: bool = True, requests: int = 1000) -> RepeatOutcome:
    """A repeat of 1000 requests by default: enough for a p99 SLO to be decided."""
    return RepeatOutcome(attainment, valid, requests)


def threshold(t: float, repeats: int = 1) -> Measure:
    """A server that meets the SLO up to rate `t` and misses it above, decided in one round."""

    def measure(rate: float, round_: int) -> RateOutcome:
        return RateOutcome(tuple(rep(1.0 if rate <= t else 0.5) for _ in range(repeats)))

    return measure


class Recorder:
    """A measure that remembers the rates it was asked for, and each (rate, round)."""

    def __init__(self, inner: Measure) -> None:
        self.inner = inner
        self.rates: list[float] = []
        self.rounds: list[tuple[float, int]] = []

    def __call__(self, rate: float, round_: int) -> RateOutcome:
        if round_ == 1:
            self.rates.append(rate)
        self.rounds.append((rate, round_))
        return self.inner(rate, round_)


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
        "below 0.3 req/s (even the lowest allowed rate 0.3 req/s does not meet the SLO: lower "
        "min_rate or the resolution, or relax the SLO)"
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
    assert "no rate measured met the SLO, down to 0.5 req/s" in str(r.answer.reason)

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
        lambda x, _round: RateOutcome((rep(1.0 if answers[x] else 0.0),)),
        spec(1.5, tolerance=0.1),
    )
    assert [s.rate for s in r.path] == list(answers)
    assert r.answer.bracket == (4.125, 4.5)
    assert max(s.rate for s in r.path if s.meets) < min(s.rate for s in r.path if not s.meets)


# --- the rule for a rate: early stopping on the pooled requests ----------------------------


@pytest.mark.parametrize(
    ("repeats", "decision", "n", "k"),
    [
        ((rep(1.0, requests=200), rep(1.0, requests=200)), "meets", 400, 0),  # pooled: 400
        ((rep(1.0, requests=200),), "undecided", 200, 0),  # one alone is too few for p99
        ((rep(0.995), rep(1.0)), "meets", 2000, 5),
        ((rep(0.98), rep(1.0)), "undecided", 2000, 20),  # 1% over: no tell either way
        ((rep(0.97), rep(0.98)), "fails", 2000, 50),
        ((rep(1.0), rep(0.2, valid=False)), "meets", 1000, 0),  # an invalid repeat is left out
        ((rep(0.2, valid=False),), "undecided", 0, 0),  # no valid repeat: nothing to tell
        ((), "undecided", 0, 0),
        ((rep(None, requests=0),), "undecided", 0, 0),  # a valid repeat without requests
    ],
)
def test_a_rate_is_decided_on_the_requests_of_its_valid_repeats(
    repeats: tuple[RepeatOutcome, ...], decision: str, n: int, k: int
) -> None:
    d = RateOutcome(repeats).decide(0.99)
    assert (d.decision, d.n, d.k, d.allowed) == (decision, n, k, 0.01)


def test_a_repeat_counts_whole_requests() -> None:
    assert rep(0.995).over == 5 and rep(0.995).counted == 1000
    assert rep(None, requests=0).over == 0 and rep(None, requests=0).counted == 0
    with pytest.raises(ServelabError, match=r"^attainment 0.9 of None requests: give the number"):
        RepeatOutcome(0.9, True)
    with pytest.raises(ServelabError, match=r"^attainment 0.5 of 3 requests is not a whole num"):
        RepeatOutcome(0.5, True, 3)


def rounds_of(per_round: dict[float, list[tuple[float, int]]]) -> Measure:
    """A measure giving, for a rate, round r's (attainment, requests) of one repeat from
    `per_round[rate][r - 1]`."""

    def measure(rate: float, round_: int) -> RateOutcome:
        a, n = per_round[rate][round_ - 1]
        return RateOutcome((rep(a, requests=n),))

    return measure


def test_an_undecided_rate_is_measured_again_until_decided() -> None:
    """Rate 2: 0 of 200 over is undecided for p99 (needs 299); a second round brings 400, all
    within the SLO: meets. Rate 4 fails in its first round; rate 3 needs three rounds."""
    m = Recorder(
        rounds_of(
            {
                2: [(1.0, 200), (1.0, 200)],
                4: [(0.5, 200)],
                3: [(1.0, 100), (1.0, 100), (1.0, 200)],
            }
        )
    )
    r = search_rate(m, spec(2, tolerance=0.5))
    assert m.rounds == [(2, 1), (2, 2), (4, 1), (3, 1), (3, 2), (3, 3)]
    assert [(s.rate, s.rounds, s.decision.decision, s.decision.n) for s in r.path] == [
        (2, 2, "meets", 400),
        (4, 1, "fails", 200),
        (3, 3, "meets", 400),
    ]
    assert [len(s.outcome.repeats) for s in r.path] == [2, 1, 3]  # every round's repeats
    assert r.answer == Answer(3, 4, "converged", None)


def test_a_rate_undecided_after_max_rounds_never_meets() -> None:
    """Rate 2 stays undecided for its 3 rounds (0 of 90 over): it counts as not meeting, so the
    bracketing goes down, and the answer names it; never a pass."""
    m = Recorder(rounds_of({2: [(1.0, 30)] * 3, 1: [(1.0, 400)], 1.5: [(1.0, 100)] * 3}))
    r = search_rate(m, spec(2, tolerance=0.5, max_rounds=3))
    assert m.rounds == [(2, 1), (2, 2), (2, 3), (1, 1), (1.5, 1), (1.5, 2), (1.5, 3)]
    assert [(s.rate, s.rounds, s.decision.decision, s.meets) for s in r.path] == [
        (2, 3, "undecided", False),
        (1, 1, "meets", True),
        (1.5, 3, "meets", True),  # 300 requests, none over, by its third round
    ]
    assert r.answer == Answer(1.5, 2, "converged", None, (2,))
    assert r.answer.text() == (
        "between 1.5 and 2 req/s (undecided, counted as not meeting: 2 req/s)"
    )
    assert r.to_json()["answer"]["undecided_rates"] == [2]
    # max_rounds 1: never measured again
    once = Recorder(rounds_of({2: [(1.0, 30)], 1: [(1.0, 400)], 1.5: [(1.0, 100)]}))
    r1 = search_rate(once, spec(2, tolerance=0.5, max_rounds=1))
    assert all(rnd == 1 for _, rnd in once.rounds)
    assert r1.answer.met_rate == 1 and r1.answer.undecided == (2, 1.5)


def test_every_rate_undecided_is_no_answer() -> None:
    """A server the search can never decide (too few requests at every rate): no rate meets,
    the search goes down to its floor, and every rate is named undecided."""
    r = search_rate(
        lambda rate, _round: RateOutcome((rep(1.0, requests=10),)),
        spec(4, min_rate=1, max_rounds=2),
    )
    assert [s.rate for s in r.path] == [4, 2, 1]
    assert r.answer.met_rate is None and r.answer.stopped == "min_rate"
    assert r.answer.undecided == (4, 2, 1)


def test_same_outcomes_same_path_with_rounds() -> None:
    table = {2: [(1.0, 200), (1.0, 200)], 4: [(0.99, 200)] * 3, 3: [(1.0, 400)]}
    a = search_rate(rounds_of(table), spec(2, tolerance=0.5))
    b = search_rate(rounds_of(table), spec(2, tolerance=0.5))
    assert a == b and dumps(a.to_json()) == dumps(b.to_json())
    assert [(s.rate, s.rounds) for s in a.path] == [(2, 2), (4, 3), (3, 1)]


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
        ({"max_rounds": 0}, r"^search max_rounds 0: give a whole number from 1 up$"),
        ({"confidence": 1}, r"^search confidence 1: give a probability between 0 and 1"),
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
    with pytest.raises(TypeError, match=r"^measure\(2.0, 1\) gave float: give a RateOutcome$"):
        search_rate(lambda r, _round: 1.0, spec(2.0))  # type: ignore[arg-type,return-value]


# --- search.json ----------------------------------------------------------------------------


def example() -> SearchResult:
    """Met up to 3.7 req/s; 3 measured in two rounds (its first undecided: 1 of 200 over)."""

    def measure(rate: float, round_: int) -> RateOutcome:
        ok = rate <= 3.7
        if rate == 3 and round_ == 1:
            return RateOutcome((RepeatOutcome(0.995, True, 200),))
        return RateOutcome(
            (
                RepeatOutcome(1.0 if ok else 0.8, True, 400),
                RepeatOutcome(0.995 if ok else 0.7, rate != 4, 400, () if rate != 4 else ("slip",)),
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
    assert doc["format_version"] == 2
    assert doc["spec"]["max_rounds"] == 3 and doc["spec"]["confidence"] == 0.95
    assert doc["path"][1]["repeats"][1] == {
        "attainment": 0.7,
        "valid": False,
        "requests": 400,
        "reasons": ["slip"],
    }
    step = doc["path"][0]
    assert {k: step[k] for k in ("rounds", "decision", "requests", "over")} == {
        "rounds": 1,
        "decision": "meets",
        "requests": 800,
        "over": 2,
    }
    assert step["decision_text"] == "meets: 2 of 800 over (upper 0.78%, allowed 1%)"
    assert step["over_lower"] < step["over_upper"] <= 0.01
    three = doc["path"][2]
    assert three["rate"] == 3 and three["rounds"] == 2 and len(three["repeats"]) == 3
    assert (three["requests"], three["over"]) == (1000, 3)
    assert doc["answer"]["undecided_rates"] == []


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
        (_set(("format_version",), 3), "$.format_version: 3 is not a version this servelab reads"),
        (_set(("format_version",), 1), "(2); its repeats were each decided alone, without early"),
        (_drop(("format_version",)), "$.format_version: required field missing"),
        (
            _set(("spec", "max_rate"), 1.5),
            "$.spec.start_rate: 2.0: above max_rate 1.5: start within",
        ),
        (_set(("path", 3, "order"), 7), "$.path[3].order: 7, where 4 follows the steps before it"),
        (
            _set(("path", 0, "decision"), "fails"),
            "$.path[0].decision: 'fails', where its repeats and the target 0.99 say 'meets'",
        ),
        (_set(("path", 0, "over"), 0), "$.path[0].over: 0, where its repeats and the target"),
        (_set(("path", 0, "decision"), "maybe"), "$.path[0].decision: 'maybe' is not one of"),
        (_drop(("path", 0, "rounds")), "$.path[0].rounds: required field missing"),
        (_set(("path", 0, "rounds"), 4), "$.path[0].rounds: 4, where an undecided rate is"),
        (
            _set(("path", 1, "repeats", 0, "requests"), None),
            "$.path[1].repeats[0]: attainment 0.8 of None requests",
        ),
        (_set(("answer", "undecided_rates"), [3]), "$.answer.undecided_rates: [3], where the"),
        (_drop(("spec", "max_rounds")), "$.spec.max_rounds: required field missing"),
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
    assert "undecided" not in svg  # no step was
    undecided = search_rate(
        rounds_of({2: [(1.0, 30)] * 3, 1: [(1.0, 400)], 1.5: [(1.0, 400)]}),
        spec(2, tolerance=0.5),
    )
    svg = render_search(undecided, tmp_path / "u")[0].read_text()
    assert "undecided (counted as not meeting)" in svg
    # a search without a bracket draws too
    edge = search_rate(threshold(25), spec(4, max_rate=20))
    assert [p.name for p in render_search(edge, tmp_path / "c", "edge")] == ["edge.svg", "edge.png"]
