"""Same outputs (servelab.analysis.outputs): two sides' completions matched by prompt and
compared token for token; the one-line text, the document block, and the verdicts that say
when too many differ."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from servelab.analysis.markdown import _claims_section
from servelab.analysis.outputs import (
    NOT_RECORDED,
    ComparedOutputs,
    OutputsAsk,
    RunOutputs,
    SameOutputs,
    compared_pairs,
    config_outputs,
    first_difference,
    outputs_compared,
    outputs_line,
    outputs_section,
    point_outputs,
    request_key,
    same_outputs,
    with_outputs,
)
from servelab.analysis.runtimes import runtimes_section
from servelab.analysis.samehost import same_host_section
from servelab.documents.declared import ClaimVerdict, RuntimesJson, SameHostJson
from servelab.store.jsonio import read_json
from servelab.store.request import RecordFieldError, RequestRecord

SCHEMAS = Path(__file__).resolve().parents[1] / "src" / "servelab" / "schemas"


def test_identical_completions() -> None:
    a = {k: [1, 2, 3, k] for k in range(5)}
    got = same_outputs(a, {k: list(v) for k, v in a.items()})
    assert (got.pairs, got.identical, got.first, got.differing_pct) == (5, 5, (), 0.0)
    assert got.text() == "same_outputs: 5 of 5 completions identical (100%)"
    assert not got.beyond(0)


def test_differing_at_position_k() -> None:
    """The first differing token counts from 1; the smallest and the median are reported."""
    a = {0: [7, 8, 9, 10], 1: [7, 8, 9, 10], 2: [1, 2, 3], 3: [5, 5, 5, 5, 5]}
    b = {0: [7, 8, 9, 10], 1: [7, 8, 0, 10], 2: [9, 2, 3], 3: [5, 5, 5, 5, 6]}
    got = same_outputs(a, b)
    assert (got.pairs, got.identical, got.first) == (4, 1, (3, 1, 5))
    assert got.differing == 3 and got.differing_pct == 75.0
    assert got.text() == (
        "same_outputs: 1 of 4 completions identical (25%); 3 differ, first at token 1 (median 3)"
    )
    one = same_outputs({0: [1, 2, 3]}, {0: [1, 2, 4]})
    assert one.text().endswith("; 1 differs, first at token 3")
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([4], [5]) == 1


def test_unequal_lengths_differ_after_the_shorter_ones_end() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3, 4, 5]) == 4
    assert first_difference([1, 2, 3, 4], [1, 2]) == 3
    assert first_difference([], [1]) == 1
    got = same_outputs({0: [1, 2], 1: [3]}, {0: [1, 2, 9], 1: [3]})
    assert (got.identical, got.first) == (1, (3,))


def test_missing_ids_leave_a_request_out_of_the_pairs() -> None:
    """Only prompts both sides recorded pair up; each side's count is kept."""
    a = {0: [1], 1: [2], 2: [3]}
    b = {1: [2], 2: [4], 5: [6]}
    got = same_outputs(a, b)
    assert (got.pairs, got.identical, got.a_recorded, got.b_recorded) == (2, 1, 3, 3)
    none = same_outputs({}, {})
    assert not none.recorded and none.text() == f"same_outputs: {NOT_RECORDED}"
    assert none.differing_pct is None and not none.beyond(0)
    one_side = same_outputs({0: [1]}, {})
    assert one_side.recorded and one_side.pairs == 0
    assert one_side.text() == "same_outputs: no completion recorded on both sides (A 1, B 0)"


def test_a_share_that_rounds_to_100_is_not_shown_as_100() -> None:
    a = {k: [1] for k in range(1000)}
    b = {**a, 999: [2]}
    assert "999 of 1000 completions identical (99.9%)" in same_outputs(a, b).text()


def test_records_pair_by_their_place_in_the_point() -> None:
    """A request id's index, slice and chat turn: the same prompt on both sides; a failed
    request or one without ids is left out."""
    assert request_key("caching-on-r01-c0004-00012") == (None, 12, None)
    assert request_key("a-r02-r0002.500-s01-00003") == (1, 3, None)
    assert request_key("a-r01-c0002-00004-t03") == (None, 4, 3)
    assert request_key("a-r01-c0001-attempt-2-00007") == (None, 7, None)
    assert request_key("warm") is None
    recs = [
        RequestRecord("x-r01-c0001-00000", 1, ok=True, output_ids=[1, 2]),
        RequestRecord("x-r01-c0001-00001", 1, ok=False, output_ids=[1]),
        RequestRecord("x-r01-c0001-00002", 1, ok=True),
    ]
    assert {k: list(v) for k, v in point_outputs(recs).items()} == {(None, 0, None): [1, 2]}
    huge = RequestRecord("x-r01-c0001-00003", 1, ok=True, output_ids=[2**64])
    assert point_outputs([huge]) == {}  # no token id is that large: left out, not a crash
    run: RunOutputs = {
        "a": {(1, 1): {(None, 0, None): (1, 2)}, (2, 1): {(None, 0, None): (3,)}},
        "b": {(1, 1): {(None, 0, None): (1, 2)}, (2, 1): {(None, 0, None): (4,)}},
    }
    got = config_outputs(run, "a", "b")  # the same index in another repeat: another prompt
    assert (got.pairs, got.identical, got.first) == (2, 1, (1,))


def test_output_ids_read_and_write_back() -> None:
    """output_ids is written only when set: older rows keep their fields and read as None."""
    rec = RequestRecord("r", 5, [1, 2], 3, output_ids=[11, 12])
    row = rec.to_json()
    assert row["output_ids"] == [11, 12] and list(row)[-1] == "output_ids"
    assert RequestRecord.from_json(json.loads(json.dumps(row))) == rec
    assert "output_ids" not in RequestRecord("r", 5).to_json()
    with pytest.raises(RecordFieldError, match=r"^\$\.output_ids: holds 'a', not an integer$"):
        RequestRecord.from_json({**json.loads(json.dumps(row)), "output_ids": [1, "a"]})


def _block(identical: int, pairs: int, max_pct: float = 0.0) -> dict[str, object]:
    first = tuple(2 for _ in range(pairs - identical))
    return dict(SameOutputs(pairs, identical, first, pairs, pairs).to_json(max_pct))


def test_the_block_follows_both_schemas() -> None:
    block = _block(58, 60)
    assert block["beyond"] is True and block["first_differing_token_min"] == 2
    for name in ("same_host", "runtimes"):
        schema = read_json(SCHEMAS / f"{name}.schema.json")
        pair = schema["properties"]["pairs"]["items"]["properties"]["same_outputs"]
        jsonschema.Draft202012Validator(pair).validate(block)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(pair).validate({**block, "pairs": -1})


def test_a_verdict_beyond_the_threshold_says_so() -> None:
    """12 of 100 completions differ: beyond the default 0%, the verdict says it; under a 20%
    threshold it stands as it was."""
    over = _block(88, 100)
    assert with_outputs("No: the same within 10% at every level and metric.", over) == (  # type: ignore[arg-type]
        "No: the same within 10% at every level and metric, but 12% of completions differ."
    )
    under = _block(88, 100, max_pct=20)
    assert with_outputs("faster", under) == "faster"  # type: ignore[arg-type]
    assert "More than analysis.max_differing_outputs_pct (0%) differ" in outputs_line(over)  # type: ignore[arg-type]
    assert "More than" not in outputs_line(under)  # type: ignore[arg-type]
    assert outputs_line(None) == f"Same outputs: {NOT_RECORDED}."


def _runtimes_doc(block: dict[str, object] | None) -> RuntimesJson:
    row = {
        "level": 8,
        "metric": "output_throughput",
        "n": 5,
        "ratio": 1.3,
        "ci_low": 1.2,
        "ci_high": 1.4,
        "p_value": 0.001,
        "answer": "DIFFERENT (faster)",
        "word": "DIFFERENT",
        "direction": "faster",
        "speed": 1.3,
        "low": 1.2,
        "high": 1.4,
        "rounds_needed": None,
        "why": None,
    }
    pair: dict[str, object] = {
        "a": {"server_config": "old", "runtime": "lock:1", "vllm_version": "0.31.0"},
        "b": {"server_config": "new", "runtime": "lock:2", "vllm_version": "0.32.0"},
        "rows": [row],
    }
    if block is not None:
        pair["same_outputs"] = block
    doc = {
        "format_version": 2,
        "axis": "concurrency",
        "method": "m",
        "alpha": 0.05,
        "threshold_pct": 2.0,
        "margin_pct": 10.0,
        "decisions": 1,
        "looks": 1,
        "interval_alpha": 0.05,
        "interleaved": True,
        "pairs": [pair],
    }
    jsonschema.Draft202012Validator(read_json(SCHEMAS / "runtimes.schema.json")).validate(doc)
    return doc  # type: ignore[return-value]


def test_runtimes_compared_says_faster_but_differing() -> None:
    text = "\n".join(runtimes_section(_runtimes_doc(_block(88, 100)), {8: "c=8"}))
    assert (
        "No: faster by more than 10% in output_throughput at c=8, but 12% of completions " in text
    )
    assert (
        "Same outputs: 88 of 100 completions identical (88%); 12 differ, first at token 2" in text
    )
    same = "\n".join(runtimes_section(_runtimes_doc(_block(100, 100)), {8: "c=8"}))
    assert "No: faster by more than 10% in output_throughput at c=8.\n" in same
    assert "100 of 100 completions identical (100%)." in same
    missing = "\n".join(runtimes_section(_runtimes_doc(None), {8: "c=8"}))
    assert f"Same outputs: {NOT_RECORDED}." in missing and "but" not in missing


def test_compared_on_this_host_shows_each_pairs_outputs() -> None:
    doc: SameHostJson = {
        "format_version": 1,
        "axis": "concurrency",
        "method": "m",
        "alpha": 0.05,
        "margin_pct": 10.0,
        "decisions": 0,
        "looks": 1,
        "interval_alpha": 0.05,
        "interleaved": True,
        "pairs": [{"a": "ref", "b": "cur", "rows": [], "same_outputs": _block(3, 4)}],  # type: ignore[typeddict-item]
    }
    jsonschema.Draft202012Validator(read_json(SCHEMAS / "same_host.schema.json")).validate(doc)
    text = "\n".join(same_host_section(doc, {}))
    assert "### cur against ref\n\nSame outputs: 3 of 4 completions identical (75%)" in text


def test_the_same_outputs_section_and_the_claims_that_compare_two_configs() -> None:
    """The first configuration against each other one, then the pairs claims name; a claim
    comparing a pair whose completions differ says so beside its verdict."""
    assert compared_pairs(["a", "b", "c"], [("b", "c"), ("b", "a"), ("c", "c"), ("x", "a")]) == [
        ("a", "b"),
        ("a", "c"),
        ("b", "c"),
    ]
    run: RunOutputs = {
        "off": {(1, 1): {(None, k, None): (1, 2, 3) for k in range(4)}},
        "on": {(1, 1): {(None, k, None): (1, 2, 3) if k else (1, 9, 3) for k in range(4)}},
    }
    compared = outputs_compared(OutputsAsk(run, 0.0), ["off", "on"])
    assert compared is not None
    lines = outputs_section(compared)
    assert lines[1] == "## Same outputs"
    assert lines[-1] == (
        "- on against off: Same outputs: 3 of 4 completions identical (75%); 1 differs, first at "
        "token 2. More than analysis.max_differing_outputs_pct (0%) differ: the two sides did not "
        "give the same answers, and their speeds are not those of the same computation."
    )
    assert outputs_compared(OutputsAsk({"off": {}, "on": {}}, 0.0), ["off", "on"]) is None
    assert outputs_section(None) == [] == outputs_section([])
    claims: list[ClaimVerdict] = [
        {
            "claim": "mean_ttft_ms[config=on,c=1] < mean_ttft_ms[config=off,c=1]",
            "verdict": "holds",
            "evidence": {"a": {"config": "on", "mean": 1.0}, "b": {"config": "off", "mean": 2.0}},
        },
        {"claim": "serialized(config=off)", "verdict": "holds", "evidence": {"spans": []}},
    ]
    table = "\n".join(_claims_section(claims, compared))
    assert "| holds, but 25% of completions differ |" in table
    assert "| `serialized(config=off)` | holds |" in table
    fine = [ComparedOutputs("off", "on", {**compared[0].block, "beyond": False})]
    assert "but" not in "\n".join(_claims_section(claims, fine))
