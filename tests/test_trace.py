"""Trace replay (servelab.workload.trace): the Mooncake-format reader, the pin, the window and
its filter, the prompts that share the trace's blocks under the tiny model's own tokenizer,
and the schedule (timestamps x time_scale, to the nanosecond)."""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from servelab.errors import ServelabError
from servelab.experiment import TraceSection
from servelab.store.jsonio import DamagedFile
from servelab.workload.synthetic import vocab_ids
from servelab.workload.trace import (
    TraceBuilder,
    TraceRow,
    blocks_of,
    check_local_pin,
    intended_reuse,
    read_trace,
    resolve_trace,
    reuse_per_row,
    scaled_block_tokens,
    schedule_ns,
    window,
    window_text,
)


def write_trace(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def section(path: Path, sha256: str | None, **kw: Any) -> TraceSection:
    base: dict[str, Any] = {"block_tokens": 16, "start_s": 0.0, "duration_s": None}
    return TraceSection(str(path), None, sha256, **{**base, **kw})


ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 8, "hash_ids": [7, 8, 9]},
    {"timestamp": 250, "input_length": 20, "output_length": 4, "hash_ids": [7, 10]},
    {"timestamp": 1333, "input_length": 30, "output_length": 4},
    {"timestamp": 2000, "input_length": 900, "output_length": 200, "hash_ids": [1]},
    {"timestamp": 60000, "input_length": 16, "output_length": 4, "hash_ids": [7]},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default tiny model's tokenizer (trained here on the built-in corpus, as the model
    stage trains it), with its whole-word vocabulary."""
    from tokenizers import Tokenizer

    from servelab.config import default_section
    from servelab.env.model import build_tokenizer_json
    from servelab.experiment import TinySpec

    d = tmp_path_factory.mktemp("tok")
    spec = default_section(TinySpec, "model", "tiny")
    (d / "tokenizer.json").write_text(build_tokenizer_json(spec.vocab_size), encoding="utf-8")
    return Tokenizer.from_file(str(d / "tokenizer.json")), vocab_ids(d)


def builder(tokenizer: Any, block_tokens: int = 16, seed: int = 0) -> TraceBuilder:
    tok, vocab = tokenizer
    return TraceBuilder(
        vocab,
        seed,
        block_tokens,
        lambda text: tok.encode(text, add_special_tokens=False).ids,
        lambda ids: tok.decode(ids),
    )


def test_requests_sharing_a_hash_id_share_its_tokens_under_the_tokenizer(
    tmp_path: Path, tokenizer: Any
) -> None:
    path = tmp_path / "t.jsonl"
    spec = section(path, write_trace(path, ROWS))
    win = window(read_trace(path), spec, None)
    prompts = builder(tokenizer).replay(win, "p0")
    tok = tokenizer[0]
    a, b, plain = (tok.encode(p.text, add_special_tokens=False).ids for p in prompts[:3])
    assert [p.input_tokens for p in prompts] == [r["input_length"] for r in ROWS]
    assert len(a) == 40 and len(b) == 20 and len(plain) == 30
    assert a[:16] == b[:16]  # block 7, in both
    assert a[16:20] != b[16:20]  # block 8 vs block 10
    assert prompts[4].text == tok.decode(a[:16])  # [7] alone: the same 16 tokens
    # the same trace built again gives the same bytes; another copy (salt) other tokens
    assert builder(tokenizer).replay(win, "p0") == prompts
    other = builder(tokenizer).replay(win, "p1")
    assert tok.encode(other[0].text, add_special_tokens=False).ids[:16] != a[:16]


def test_a_block_cut_short_is_the_start_of_the_whole_block(tokenizer: Any) -> None:
    b = builder(tokenizer)
    short = TraceRow(0, 20, 1, (5, 6), 1)
    long = TraceRow(0, 30, 1, (5, 6), 2)
    assert b.ids(long, 1, "s")[:20] == b.ids(short, 0, "s")


def test_the_schedule_is_the_timestamps_times_the_scale_to_the_nanosecond(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    spec = section(path, write_trace(path, ROWS), start_s=0.25)
    win = window(read_trace(path), spec, None)
    assert [r.timestamp for r in win.rows] == [250, 1333, 2000, 60000]
    assert schedule_ns(win, 1.0) == [0, 1_083_000_000, 1_750_000_000, 59_750_000_000]
    assert schedule_ns(win, 0.5) == [0, 541_500_000, 875_000_000, 29_875_000_000]
    scale = 1 / 3
    exact = [round((Fraction(t) - 250) * 10**6 * Fraction(scale)) for t in (250, 1333, 2000, 60000)]
    assert schedule_ns(win, scale) == exact
    # a level is a rate: its time scale replays the window's recorded rate that much faster
    assert win.recorded_rate == pytest.approx(4 / 59.75)
    assert win.time_scale(2 * win.recorded_rate) == pytest.approx(0.5)


def test_the_window_and_the_model_length_filter_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    spec = section(path, write_trace(path, ROWS), duration_s=10, min_kept=0.75)
    win = window(read_trace(path), spec, 1024)
    record = win.record()
    assert {k: v for k, v in record.items() if k not in ("fit", "original", "replayed")} == {
        "start_s": 0.0,
        "duration_s": 10.0,
        "in_window": 4,
        "requests": 3,
        "rejected": {"over_model_len": 1, "failed_in_trace": 0},
        "recorded_rate": 0.4,
        "kept_share": 0.75,
    }
    assert record["fit"] == {
        "length_scale": 1.0,
        "block_tokens": 16,
        "max_output_tokens": None,
        "over_limit": "drop",
        "capped": 0,
        "truncated": 0,
        "min_kept": 0.75,
    }
    # the window as recorded against as replayed: the long request is only in the first
    assert record["original"]["input_p90"] == 900 and record["replayed"]["input_p90"] == 40
    assert record["original"]["rate"] == 0.4 and record["replayed"]["rate"] == 0.3
    with pytest.raises(ServelabError, match="no request between start_s 61"):
        window(read_trace(path), section(path, None, start_s=61.0), None)


def test_a_window_that_keeps_too_few_is_refused_naming_a_scale_that_fits(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    spec = section(path, write_trace(path, ROWS), duration_s=10)
    with pytest.raises(ServelabError) as err:
        window(read_trace(path), spec, 1024)
    said = str(err.value)
    assert "keeps 3 of the window's 4 requests (75%; left out: 1 over_model_len)" in said
    # 900 + 200 tokens at 1/2: 450 + 100 fits 1024, and 16 x 1/2 keeps blocks whole
    assert "set workload.trace.length_scale: 0.5 (1/2: keeps 100%)" in said
    assert "\n" not in said


def test_length_scale_keeps_every_block_and_shared_prefix(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    spec = section(path, write_trace(path, ROWS), duration_s=10, length_scale=0.25)
    rows = read_trace(path)
    win = window(rows, spec, 1024)
    assert win.block_tokens == 4 and win.kept_share == 1.0
    # lengths x 1/4 rounded up: 40 -> 10, 20 -> 5, 30 -> 8 (7.5), 900 -> 225; outputs 8 -> 2
    assert [(r.input_length, r.output_length) for r in win.rows] == [
        (10, 2), (5, 1), (8, 1), (225, 50)
    ]  # fmt: skip
    # every request touches the blocks it touched at full scale
    for full, scaled in zip(rows, win.rows, strict=False):
        assert len(blocks_of(full, 16)) == len(blocks_of(scaled, 4))
    # the reuse the trace implies is kept: 16 of 60 tokens at 16, 4 of 15 at 4
    before = intended_reuse(rows[:2], 16)
    after = intended_reuse(win.rows[:2], 4)
    assert before["reuse_ratio"] == pytest.approx(after["reuse_ratio"])
    with pytest.raises(ServelabError, match=r"0.3 x block_tokens 16 = 4.8 is not a whole"):
        scaled_block_tokens(16, 0.3)


def test_over_limit_truncate_and_the_output_cap_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    digest = write_trace(path, ROWS)
    spec = section(path, digest, duration_s=10, over_limit="truncate", max_output_tokens=150)
    win = window(read_trace(path), spec, 1024, special=1)
    # 900 + 1 + 200: the output capped at 150, then still over: the input cut to 1024 - 151
    assert win.rows[-1].input_length == 873 and win.rows[-1].output_length == 150
    assert win.fit.capped == 1 and win.fit.truncated == 1 and win.kept_share == 1.0
    assert window_text(win.record()) == (
        "window 0-10 s: 4 of 4 kept, 1 outputs capped at 150, 1 inputs truncated"
    )


def test_failed_requests_of_the_trace_are_left_out_and_counted() -> None:
    rows = [
        TraceRow(i * 100, 10, 0 if i == 2 else 5, None, i + 1, failed=i == 2) for i in range(40)
    ]
    spec = TraceSection("t", None, None, 16, 0.0, 4.0)
    win = window(rows, spec, 1024)
    assert len(win.rows) == 39 and win.rejected["failed_in_trace"] == 1
    assert win.record()["original"]["requests"] == 40
    spec_strict = TraceSection("t", None, None, 16, 0.0, 4.0, min_kept=1.0)
    with pytest.raises(ServelabError, match="records 1 as failed"):
        window(rows, spec_strict, 1024)


def test_the_reuse_the_trace_implies() -> None:
    rows = [
        TraceRow(0, 40, 1, (7, 8, 9), 1),
        TraceRow(1, 20, 1, (7, 10), 2),  # block 7 again: 16 tokens
        TraceRow(2, 40, 1, (7, 8, 9), 3),  # 7 and 8 whole, 9's 8 tokens
        TraceRow(3, 16, 1, (8,), 4),  # 8 at another place: not a prefix
        TraceRow(4, 10, 1, None, 5),
    ]
    assert reuse_per_row(rows, 16) == [0, 16, 40, 0, 0]  # per request, as synth copies it
    got = intended_reuse(rows, 16)
    assert got["reused_tokens"] == 16 + 40
    assert got["requests_with_reuse"] == 2
    assert got["prompt_tokens"] == 126
    assert got["reuse_ratio"] == round(56 / 126, 6)


def test_a_tampered_trace_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    pin = write_trace(path, ROWS)
    assert check_local_pin(section(path, pin)) is not None
    path.write_text(path.read_text().replace('"input_length": 40', '"input_length": 41'))
    with pytest.raises(ServelabError, match=r"workload\.trace\.path .*sha256 is .*pins") as e:
        check_local_pin(section(path, pin))
    assert "\n" not in str(e.value)
    with pytest.raises(ServelabError, match="workload.trace"):
        resolve_trace(section(path, pin))


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ('{"timestamp": "0", "input_length": 1, "output_length": 1}', "timestamp"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1}', "input_length"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}', "hash_ids"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_damaged_trace_names_the_line(tmp_path: Path, line: str, where: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n' + line + "\n")
    with pytest.raises(DamagedFile, match=f"line 2.*{where}"):
        read_trace(path)


def test_timestamps_going_back_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, [ROWS[1], ROWS[0]])
    with pytest.raises(DamagedFile, match="line 2.*before"):
        read_trace(path)


def test_a_hub_trace_is_pinned_to_a_commit_and_named_as_a_trace() -> None:
    from servelab.experiment import HubDataset

    spec = TraceSection(None, HubDataset("org/traces", "t.jsonl", "main"), None, 512, 0.0, None)
    with pytest.raises(ServelabError, match=r"^workload\.trace\.hub\.revision: 'main' is not") as e:
        resolve_trace(spec)
    assert "workload.dataset" not in str(e.value)
    assert check_local_pin(spec) is None  # checked when the sweep downloads it


def test_the_busiest_window_is_found_and_recorded() -> None:
    # one request a second, then a burst of 10 in 1 s at 30 s, then one a second again
    times = [i * 1000 for i in range(30)] + [30000 + 100 * i for i in range(10)]
    times += [31000 + i * 1000 for i in range(30)]
    rows = [TraceRow(t, 10, 5, None, i + 1) for i, t in enumerate(times)]
    spec = TraceSection("t", None, None, 16, 0.0, None, busiest=5.0)
    win = window(rows, spec, 1024)
    # 14 requests from 26 s (26-29 and the burst) and from 27 s (27-29, the burst, 31): the
    # earliest of equals
    assert win.record()["start_s"] == 26.0 and win.record()["duration_s"] == 5.0
    assert win.in_window == 14 and win.recorded_rate == 14 / 5
