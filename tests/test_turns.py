"""Per-turn metrics of multi-turn chat points (analysis/turns.py): known TTFT, TPOT and prompt
tokens by turn, conversations and their durations, failures, points left out by validity, the
rate axis, nothing for raw data without turns, and the same rows from a raw tree."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from analysis_fixtures import T0, servelab_point

from servelab.analysis.dataset import load_dataset
from servelab.analysis.turns import (
    CONVERSATION_COLUMNS,
    TURN_COLUMNS,
    TurnPoint,
    turn_tables,
    turns_of,
    turns_section,
)
from servelab.client import RequestRecord
from servelab.store.jsonio import dumps, write_json, write_jsonl_gz

OUT = 5  # output tokens of every turn


def turn(conv: int, k: int, start_ns: int, ttft_ms: float, ok: bool = True) -> RequestRecord:
    """Turn k of conversation `conv`, sent at start_ns: TTFT ttft_ms, then a token every
    2 ms (TPOT 2 ms, E2EL ttft + 8 ms), prompt tokens 100 k, cached 100 (k - 1)."""
    first = round(ttft_ms * 1000)
    rec = RequestRecord(f"l-{conv:05d}-t{k}", start_ns, conversation=conv, turn=k)
    if not ok:
        rec.error = f"not sent: turn {k - 1} failed"
        return rec
    rec.chunk_offsets_us = [first + 2000 * i for i in range(OUT)]
    rec.done_offset_us = rec.chunk_offsets_us[-1]
    rec.prompt_tokens, rec.output_tokens, rec.cached_tokens = 100 * k, OUT, 100 * (k - 1)
    rec.ok, rec.http_status = True, 200
    rec.empty_chunks, rec.chunk_tokens = [], [1] * OUT
    return rec


def conversation(conv: int, start_ns: int, ttfts_ms: list[float], think_ms: float = 50,
                 ok_turns: int | None = None) -> list[RequestRecord]:  # fmt: skip
    """One conversation: turn k's TTFT ttfts_ms[k - 1], sent think_ms after the previous end;
    the turns after `ok_turns` failed (not sent)."""
    out, t = [], start_ns
    for k, ttft in enumerate(ttfts_ms, 1):
        ok = ok_turns is None or k <= ok_turns
        rec = turn(conv, k, t, ttft, ok)
        out.append(rec)
        if ok:
            assert rec.done_offset_us is not None
            t += rec.done_offset_us * 1000 + round(think_ms * 1e6)
    return out


def test_known_values_by_turn_and_conversation() -> None:
    # two repeats of concurrency 2, two conversations each, 3 turns; TTFT 10 k ms in repeat 1,
    # 20 k ms in repeat 2, so each turn pools 10 k, 10 k, 20 k, 20 k
    points = [
        TurnPoint(
            "sc",
            2,
            rep,
            conversation(0, T0, [10.0 * rep * k for k in (1, 2, 3)])
            + conversation(1, T0, [10.0 * rep * k for k in (1, 2, 3)]),
        )  # fmt: skip
        for rep in (1, 2)
    ]
    tables = turn_tables(points)
    assert set(tables) == {"turns", "conversations"}
    rows = tables["turns"]
    assert [r["turn"] for r in rows] == [1, 2, 3]
    for r in rows:
        k = r["turn"]
        assert set(r) == set(TURN_COLUMNS)
        assert (r["server_config"], r["concurrency"], r["repeats"], r["left_out"]) == ("sc", 2,
                                                                                     2, 0)  # fmt: skip
        assert (r["requests"], r["completed"]) == (4, 4)
        assert r["mean_ttft_ms"] == pytest.approx(15.0 * k)
        assert r["p50_ttft_ms"] == pytest.approx(15.0 * k)
        assert r["p90_ttft_ms"] == pytest.approx(20.0 * k)  # numpy's linear percentile
        assert r["mean_tpot_ms"] == pytest.approx(2.0)
        assert r["mean_prompt_tokens"] == 100.0 * k
        assert r["mean_cached_tokens"] == 100.0 * (k - 1)
    (c,) = tables["conversations"]
    assert set(c) == set(CONVERSATION_COLUMNS)
    assert (c["conversations"], c["completed"], c["turns_completed"]) == (4, 4, 12)
    assert c["mean_turns_completed"] == 3.0
    # a conversation: three turns of TTFT 10/20/30 k ms + 8 ms each, two thinks of 50 ms
    rep1 = (10 + 20 + 30) + 3 * 8 + 2 * 50
    rep2 = (20 + 40 + 60) + 3 * 8 + 2 * 50
    assert c["mean_duration_s"] == pytest.approx((rep1 + rep2) / 2 / 1000)


def test_a_failed_turn_counts_and_its_conversation_does_not_complete() -> None:
    recs = conversation(0, T0, [10, 20, 30], ok_turns=1) + conversation(1, T0, [10, 20, 30])
    tables = turn_tables([TurnPoint("sc", 2, 1, recs)])
    by_turn = {r["turn"]: r for r in tables["turns"]}
    assert [(by_turn[k]["requests"], by_turn[k]["completed"]) for k in (1, 2, 3)] == [
        (2, 2), (2, 1), (2, 1)
    ]  # fmt: skip
    assert by_turn[2]["mean_ttft_ms"] == pytest.approx(20.0)  # the successful request only
    (c,) = tables["conversations"]
    assert (c["conversations"], c["completed"], c["turns_completed"]) == (2, 1, 4)
    assert c["mean_turns_completed"] == 2.0
    assert c["mean_duration_s"] == pytest.approx((60 + 24 + 100) / 1000)  # the completed one


def test_every_turn_failed_leaves_the_latencies_empty() -> None:
    recs = [turn(0, 1, T0, 10, ok=False)]
    (row,) = turn_tables([TurnPoint("sc", 1, 1, recs)])["turns"]
    assert row["completed"] == 0 and row["mean_ttft_ms"] is None and row["p90_ttft_ms"] is None
    assert row["mean_prompt_tokens"] is None


def test_points_without_turns_give_nothing() -> None:
    plain = RequestRecord("l-00000", T0, [1000], 2000, 10, 2, True)
    assert turn_tables([TurnPoint("sc", 1, 1, [plain])]) == {}
    assert turn_tables([]) == {}
    assert turns_section({}, "concurrency") == []


def test_left_out_points_are_counted_not_used() -> None:
    good = TurnPoint("sc", 4, 1, conversation(0, T0, [10, 20]))
    bad = TurnPoint("sc", 4, 2, conversation(0, T0, [900, 900]), left_out=True)
    tables = turn_tables([good, bad])
    assert [(r["repeats"], r["left_out"], r["requests"]) for r in tables["turns"]] == [
        (1, 1, 1), (1, 1, 1)
    ]  # fmt: skip
    assert [r["mean_ttft_ms"] for r in tables["turns"]] == pytest.approx([10.0, 20.0])
    assert tables["conversations"][0]["conversations"] == 1
    assert "- concurrency 4: 1 repeat(s) left out" in "\n".join(
        turns_section(tables, "concurrency")
    )


def test_rate_axis_and_order() -> None:
    points = [
        TurnPoint("b", 2.5, 1, conversation(0, T0, [10])),
        TurnPoint("a", 5.0, 1, conversation(0, T0, [10, 10])),
        TurnPoint("a", 2.5, 1, conversation(0, T0, [10])),
    ]
    tables = turn_tables(points, "rate")
    assert [(r["server_config"], r["rate"], r["turn"]) for r in tables["turns"]] == [
        ("a", 2.5, 1), ("a", 5.0, 1), ("a", 5.0, 2), ("b", 2.5, 1)
    ]  # fmt: skip
    assert all("concurrency" not in r for r in tables["turns"] + tables["conversations"])
    text = "\n".join(turns_section(tables, "rate"))
    assert "| Rate (req/s) | Turn |" in text and "### a" in text and "### b" in text


def test_the_report_section() -> None:
    tables = turn_tables([TurnPoint("sc", 2, 1, conversation(0, T0, [12.5, 1500]))])
    lines = turns_section(tables, "concurrency")
    assert lines[:2] == ["## TTFT by turn", ""] and lines[-1] == ""
    text = "\n".join(lines)
    assert "| 2 | 1 | 1 of 1 | 12.5 ms | 12.5 ms | 12.5 ms | 2.0 ms | 100.0 |" in text
    assert "| 2 | 2 | 1 of 1 | 1.50 s | 1.50 s | 1.50 s | 2.0 ms | 200.0 |" in text
    assert "| 2 | 1 | 1 | 1 | 2.00 | 1.58 s |" in text  # 12.5 + 1500 + 2 x 8 + 50 ms


def chat_point(exp: Path, sc: str, rep: int, conc: int, ttfts: list[float]) -> None:
    """A measured point of `conc` conversations (servelab's raw layout), point.json with its
    `chat` block."""
    point = servelab_point(exp, sc, rep, conc, 100.0, 10.0)
    d = exp / "raw" / sc / f"rep{rep:02d}" / f"c{conc:04d}"
    recs = [r for i in range(conc) for r in conversation(i, T0 + rep * 10**12, ttfts, 1000)]
    for r in recs:  # (1 s of think time: long enough a point for the validity checks)
        r.request_id = f"{sc}-r{rep:02d}-c{conc:04d}-{r.request_id[2:]}"
        r.cached_tokens = None  # (no prefix caching asked for: none reported)
    write_jsonl_gz(d / "requests.jsonl.gz", [r.to_json() for r in recs])
    point["chat"] = {"turns": len(ttfts), "think_time_s": 0.05}
    point["num_prompts"] = point["completed"] = len(recs)
    point["failed"] = 0
    write_json(d / "point.json", point)


def test_read_from_a_raw_tree(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    chat_point(exp, "sc", 1, 2, [10, 30])
    chat_point(exp, "sc", 2, 2, [20, 40])
    servelab_point(exp, "sc", 1, 4, 100.0, 10.0)  # a point of plain prompts: no chat block
    servelab_point(exp, "sc", 2, 4, 100.0, 10.0)
    ds = load_dataset(exp)
    points = ds.turn_points
    assert [(p.server_config, p.level, p.repeat, len(p.records)) for p in points] == [
        ("sc", 2, 1, 4), ("sc", 2, 2, 4)
    ]  # fmt: skip
    assert not any(p.left_out for p in points)
    tables = turns_of(ds)
    assert [(r["concurrency"], r["turn"], r["requests"]) for r in tables["turns"]] == [
        (2, 1, 4), (2, 2, 4)
    ]  # fmt: skip
    assert [r["mean_ttft_ms"] for r in tables["turns"]] == pytest.approx([15.0, 35.0])
    assert [r["concurrency"] for r in tables["conversations"]] == [2]
    # a pure function of the raw data: the same bytes again
    assert dumps(turns_of(load_dataset(exp))) == dumps(tables)
    json.loads(dumps(tables))


def test_a_tree_without_chat_points_gives_nothing(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    servelab_point(exp, "sc", 1, 4, 100.0, 10.0)
    assert turns_of(load_dataset(exp)) == {}


def test_a_raw_point_validity_leaves_out_is_counted(tmp_path: Path) -> None:
    """A chat point too short for the min_duration check: its TTFT is left out of every
    statistic, so here it is counted, and adds no request."""
    exp = tmp_path / "exp"
    chat_point(exp, "sc", 1, 2, [10, 30])
    point = exp / "raw" / "sc" / "rep01" / "c0002"
    rows = [json.loads(x) for x in gzip.open(point / "requests.jsonl.gz", "rt")]
    for r in rows:  # every turn sent at once: the point lasts 46 ms
        r["sent_epoch_ns"] = T0
    write_jsonl_gz(point / "requests.jsonl.gz", rows)
    ds = load_dataset(exp)
    assert not ds.points[0].valid
    tables = turns_of(ds)
    assert tables["turns"] == []
    (c,) = tables["conversations"]
    assert (c["repeats"], c["left_out"], c["conversations"]) == (0, 1, 0)
