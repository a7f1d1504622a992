"""A point's level (servelab.design.level.Level): read from a point record, written back, named as a
folder of the raw layout, printed, ordered."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.design.level import CONCURRENCY, RATE, Level
from servelab.design.schedule import plan
from servelab.store.paths import ExperimentPaths, rate_dir


def test_a_point_record_gives_its_rate_else_its_concurrency() -> None:
    closed = Level.from_record({"server_config": "a", "repeat": 1, "concurrency": 8})
    assert (closed.axis, closed.value, closed.is_rate) == (CONCURRENCY, 8, False)
    assert type(closed.value) is int
    assert (closed.concurrency, closed.rate) == (8, None)
    opened = Level.from_record({"repeat": 1, "rate": 2.5, "arrival": {"process": "poisson"}})
    assert (opened.axis, opened.value, opened.is_rate) == (RATE, 2.5, True)
    assert (opened.concurrency, opened.rate) == (None, 2.5)
    # a whole-number rate is still a rate, as a float; a null rate is no rate
    assert Level.from_record({"rate": 2}) == Level(RATE, 2.0)
    assert type(Level.from_record({"rate": 2}).value) is float
    assert Level.from_record({"rate": None, "concurrency": 4}) == Level.at_concurrency(4)
    # the rate wins over a concurrency beside it (a cap on requests in flight is no level)
    assert Level.from_record({"rate": 1.0, "concurrency": 4}).is_rate
    with pytest.raises(KeyError):
        Level.from_record({"repeat": 1})


def test_a_level_writes_back_the_key_it_was_read_from() -> None:
    assert Level.at_concurrency(8).to_json() == {"concurrency": 8}
    assert Level.at_rate(2.5).to_json() == {"rate": 2.5}
    for record in ({"concurrency": 16}, {"rate": 0.25}):
        assert Level.from_record(record).to_json() == record


def test_on_an_axis_and_the_axes_it_knows() -> None:
    assert Level.on("concurrency", 4.0) == Level.at_concurrency(4)
    assert type(Level.on("concurrency", 4.0).value) is int
    assert Level.on("rate", 3) == Level.at_rate(3.0)
    with pytest.raises(ValueError, match="level axis 'qps'"):
        Level("qps", 1)


@pytest.mark.parametrize(
    ("level", "dirname"),
    [
        (Level.at_concurrency(1), "c0001"),
        (Level.at_concurrency(8), "c0008"),
        (Level.at_concurrency(256), "c0256"),
        (Level.at_concurrency(12345), "c12345"),
        (Level.at_rate(2.5), "r0002.500"),
        (Level.at_rate(0.25), "r0000.250"),
        (Level.at_rate(1234.5), "r1234.500"),
        (Level.at_rate(12345), "r12345.000"),
    ],
)
def test_the_folder_of_a_level(level: Level, dirname: str) -> None:
    assert level.dirname == dirname


def test_the_raw_layout_names_points_by_their_level(tmp_path: Path) -> None:
    paths = ExperimentPaths(tmp_path)
    assert paths.point("a", 2, 8) == tmp_path / "raw/a/rep02/c0008"
    assert paths.rate_point("a", 1, 2.5) == tmp_path / "raw/a/rep01/r0002.500"
    assert paths.level_point("a", 3, Level.at_rate(12.5)) == tmp_path / "raw/a/rep03/r0012.500"
    assert rate_dir(0.5) == "r0000.500"
    closed, opened = plan([8], 1, "fixed")[0], plan([2.5], 1, "fixed", axis="rate")[0]
    assert paths.slot("a", closed) == tmp_path / "raw/a/rep01/c0008"
    assert paths.slot("a", opened) == tmp_path / "raw/a/rep01/r0002.500"


def test_how_a_level_is_printed() -> None:
    assert str(Level.at_concurrency(8)) == "c=8"
    assert str(Level.at_rate(2.5)) == "rate=2.5"
    assert str(Level.at_rate(4)) == "rate=4"
    assert str(Level.at_rate(0.125)) == "rate=0.125"
    # as it was given (reports print the levels of their tables)
    assert str(Level(CONCURRENCY, 8.0)) == "c=8.0"
    slot = plan([0.5], 1, "fixed", axis="rate")[0]
    assert slot.name() == "rate=0.5"


def test_levels_sort_by_axis_then_value() -> None:
    mixed = [
        Level.at_rate(2.5),
        Level.at_concurrency(64),
        Level.at_rate(0.5),
        Level.at_concurrency(8),
        Level.at_rate(10),
    ]
    assert [str(x) for x in sorted(mixed)] == ["c=8", "c=64", "rate=0.5", "rate=2.5", "rate=10"]
    # by number, not by folder name or text
    assert Level.at_concurrency(9) < Level.at_concurrency(10)
    assert Level.at_rate(9.5) < Level.at_rate(10.0)
    assert max(Level.at_concurrency(c) for c in (1, 16, 4)) == Level.at_concurrency(16)


def test_levels_are_equal_by_axis_and_value_and_hash_alike() -> None:
    assert Level.at_concurrency(4) == Level(CONCURRENCY, 4)
    assert Level.at_concurrency(4) != Level.at_rate(4)
    assert {Level.at_rate(2), Level.at_rate(2.0), Level.at_concurrency(2)} == {
        Level.at_rate(2.0),
        Level.at_concurrency(2),
    }


def test_the_plan_gives_each_slot_its_level_and_run_json_its_key() -> None:
    slots = plan([1, 4], 1, "fixed")
    assert [s.level for s in slots] == [Level.at_concurrency(1), Level.at_concurrency(4)]
    assert [s.key for s in slots] == [(1, 1), (1, 4)]
    assert slots[1].to_json() == {"repeat": 1, "concurrency": 4, "position": 1, "run_index": 1}
    rates = plan([0.5], 1, "fixed", axis="rate")
    assert rates[0].to_json() == {"repeat": 1, "rate": 0.5, "position": 0, "run_index": 0}
