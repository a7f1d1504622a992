"""`servelab trace stats` and `servelab trace synth`: the busiest window, a trace's statistics,
the synthetic trace and its fidelity to the source (servelab.workload.trace_stats,
servelab.workload.trace_synth)."""

from __future__ import annotations

import hashlib
import json
import random
from fractions import Fraction
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from servelab.cli import main
from servelab.errors import ServelabError
from servelab.workload.trace import intended_reuse, read_trace, reuse_per_row
from servelab.workload.trace_formats import TraceRow
from servelab.workload.trace_stats import Span, busiest_start_ms, choose_window, nearest_rank
from servelab.workload.trace_summary import StatsOptions, summarize
from servelab.workload.trace_synth import (
    SynthPlan,
    jsonl_bytes,
    synthesize,
    synthetic_stats,
)

SAMPLE = Path(__file__).resolve().parents[1] / "datasets" / "mooncake-sample.jsonl"


def rows_at(*ts: float) -> list[TraceRow]:
    return [TraceRow(t, 10, 1, None, i) for i, t in enumerate(ts, 1)]


def brute_busiest(rows: list[TraceRow], seconds: float) -> int | float:
    """Every request's window counted on its own; the earliest of the fullest."""
    width = Fraction(seconds) * 1000
    ts = [Fraction(r.timestamp) for r in rows]
    counts = [sum(1 for t in ts if 0 <= t - s < width) for s in ts]
    return rows[counts.index(max(counts))].timestamp


# --- the busiest window ------------------------------------------------------------------


def test_busiest_window_is_the_fullest_and_the_earliest_of_ties() -> None:
    rows = rows_at(0, 100, 200, 61000, 61000, 61001, 120000)
    assert busiest_start_ms(rows, 60) == 61000  # 4 requests against 3 from 0
    assert busiest_start_ms(rows_at(0, 1000, 70000, 71000), 60) == 0  # 2 and 2: the earlier
    assert busiest_start_ms(rows_at(5), 60) == 5  # one request
    assert busiest_start_ms(rows_at(0, 10, 20), 3600) == 0  # the trace is shorter than it


def test_busiest_window_excludes_its_end_and_counts_exactly() -> None:
    # [0, 60 s) holds one request; [60 s, 120 s) two: the end is not in the window
    assert busiest_start_ms(rows_at(0, 60000, 60000), 60) == 60000
    # float timestamps, compared exactly: 59999.5 is inside [0, 60000), 60000.5 is not
    assert busiest_start_ms(rows_at(0, 59999.5, 60000.5, 60000.5), 60) == 59999.5
    assert busiest_start_ms(rows_at(0, 0.25, 0.5, 1.5), 0.001) == 0  # 1 ms: 0, 0.25, 0.5


def test_busiest_window_agrees_with_counting_every_window() -> None:
    for seed in range(4):
        rng = random.Random(seed)
        ts = sorted(
            rng.choice([rng.randrange(0, 300_000), rng.randrange(0, 300_000) / 7])
            for _ in range(60)
        )
        rows = rows_at(*ts)
        for seconds in (1, 30, 60, 90.5):
            assert busiest_start_ms(rows, seconds) == brute_busiest(rows, seconds)


def test_busiest_window_errors() -> None:
    with pytest.raises(ServelabError, match="no request"):
        busiest_start_ms([], 60)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ServelabError, match="above 0"):
            busiest_start_ms(rows_at(0), bad)


# --- the statistics ------------------------------------------------------------------------

TIMES = (0, 1000, 2000, 30000, 59999, 60000, 61000, 61500, 90000, 120000, 150000)


def hand_rows() -> list[TraceRow]:
    """11 requests: input 100 i, output 10 i; each continues the one before (blocks of 100)."""
    return [TraceRow(t, 100 * i, 10 * i, tuple(range(i)), i) for i, t in enumerate(TIMES, 1)]


def write_trace(path: Path, rows: list[TraceRow]) -> Path:
    path.write_bytes(jsonl_bytes(rows))
    return path


def test_nearest_rank() -> None:
    v = list(range(1, 12))
    assert [nearest_rank(v, p) for p in (50, 90, 99, 100)] == [6, 10, 11, 11]
    assert nearest_rank([7], 50) == 7 and nearest_rank([1, 2], 50) == 1


def test_stats_of_a_hand_made_trace() -> None:
    rows = hand_rows()
    inside, span = choose_window(rows, None, None)
    assert span.duration_ms == 150000 and len(inside) == 11
    st = summarize(inside, span, StatsOptions(100, 60.0, 550, (0.5, 0.125)))
    assert st.rate == pytest.approx(11 / 150)
    assert [(b.requests, float(b.seconds)) for b in st.bins] == [(5, 60), (4, 60), (2, 30)]
    assert st.bins[2].rate == pytest.approx(2 / 30)
    # from 2 s: 2, 30, 59.999, 60, 61, 61.5 s; from 0 or 1 s only 5
    assert (st.busiest_start_ms, st.busiest_requests) == (2000, 6)
    assert st.input is not None and st.output is not None
    assert st.input.quantiles == {50: 600, 90: 1000, 99: 1100} and st.input.max == 1100
    assert st.input.mean == 600 and st.output.quantiles[50] == 60
    # request i reuses the i - 1 blocks of the one before it
    assert st.reuse is not None and st.reuse["requests_with_reuse"] == 10
    assert st.reuse["reused_tokens"] == sum(100 * (i - 1) for i in range(1, 12))
    # input + output = 110 i: i <= 5 fit 550; at 0.5 (55 i) i <= 10; 0.125 cuts the blocks
    unscaled, half, eighth = st.fits
    assert (unscaled.scale, unscaled.fitting, unscaled.total) == (None, 5, 11)
    assert (half.fitting, half.error) == (10, None)
    assert eighth.error is not None and "12.5 is not a whole number" in eighth.error
    # 1/2 keeps 10 of 11 (90.9%); 1/4 (25 i + ceil(2.5 i)) all 11
    assert st.suggestion is not None
    d, fit = st.suggestion
    assert d == 4 and fit.fitting == 11


def test_stats_leave_failed_requests_out_of_lengths_and_count_them() -> None:
    rows = [*hand_rows(), TraceRow(150000, 99999, 0, None, 12, failed=True)]
    inside, span = choose_window(rows, None, None)
    st = summarize(inside, span, StatsOptions(100, 60.0, 550))
    assert (st.requests, st.failed) == (12, 1)
    assert st.input is not None and st.input.max == 1100
    assert st.reuse is not None and st.reuse["requests"] == 11
    assert st.fits[0].total == 11 and st.bins[-1].requests == 3


def test_windows_chosen_and_refused() -> None:
    rows = hand_rows()
    inside, span = choose_window(rows, "60:60", None)
    assert [r.timestamp for r in inside] == [60000, 61000, 61500, 90000]
    inside, span = choose_window(rows, "90:", None)
    assert [r.timestamp for r in inside] == [90000, 120000, 150000] and span.duration_ms == 60000
    inside, span = choose_window(rows, None, 60)
    assert (span.start_ms, len(inside)) == (Fraction(2000), 6)
    for bad in ("60", "abc:1", "-1:10", "10:0"):
        with pytest.raises(ServelabError, match="START:DURATION"):
            choose_window(rows, bad, None)
    with pytest.raises(ServelabError, match=r"no request in it \(the trace spans 0-150 s\)"):
        choose_window(rows, "500:10", None)


def test_stats_cli_prints_the_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.jsonl", hand_rows())
    args = ["--block-tokens", "100", "--max-model-len", "550", "--length-scale", "0.5", "0.125"]
    assert main(["trace", "stats", str(path), *args]) == 0
    out = capsys.readouterr().out
    assert "11 requests, 0.07 req/s" in out
    assert "busiest 60 s: from 2 s, 6 requests" in out
    assert "     2         2    0.07" in out  # the last minute: 2 requests over 30 s
    assert "  input               600    1,000    1,100    1,100      600.0" in out
    assert "10 of 11 requests reuse a prefix" in out
    assert "as recorded                     5 of 11 (45.5%)" in out
    assert "length_scale 0.5               10 of 11 (90.9%)" in out
    assert "0.125 x block_tokens 100 = 12.5 is not a whole number" in out
    assert "suggestion: length_scale 0.25 (1/4)" in out
    assert main(["trace", "stats", str(path)]) == 0
    assert "fits" not in capsys.readouterr().out


def test_stats_cli_plain_trace_and_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = [
        TraceRow(r.timestamp, r.input_length, r.output_length, None, r.line) for r in hand_rows()
    ]
    path = write_trace(tmp_path / "plain.jsonl", plain)
    assert main(["trace", "stats", str(path), "--busiest", "30"]) == 0
    out = capsys.readouterr().out
    assert "prefix reuse: no prefix ids: no reuse recorded" in out
    assert "window: the busiest 30 s, 59.999-89.999 s: 4 requests" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 5, "input_length": 1, "output_length": 1}\n{"timestamp": 1}\n')
    for argv in (
        ["trace", "stats", str(tmp_path / "missing.jsonl")],
        ["trace", "stats", str(bad)],
        ["trace", "stats", str(path), "--window", "999:1"],
        ["trace", "stats", str(path), "--length-scale", "0.5"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("servelab: ") and err.count("\n") == 1, err
    assert main(["trace", "stats", str(bad)]) == 2
    assert "line 2: timestamp 1 is before" in capsys.readouterr().err


def test_png_is_the_same_bytes_for_the_same_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "t.jsonl", hand_rows())
    pngs = []
    for name, extra in (("a", []), ("b", []), ("c", ["--window", "60:60"])):
        out = tmp_path / f"{name}.png"
        assert main(["trace", "stats", str(path), "--png", str(out), *extra]) == 0
        assert f"wrote {out}" in capsys.readouterr().out
        pngs.append(out.read_bytes())
    assert pngs[0].startswith(b"\x89PNG") and pngs[0] == pngs[1]
    assert pngs[2] != pngs[0]  # another window draws another figure


# --- the synthetic trace -------------------------------------------------------------------


def test_the_reuse_per_request_that_synth_copies() -> None:
    sample = read_trace(SAMPLE)
    hits = reuse_per_row(sample, 128)
    assert hits[0] == 0 and sum(h > 0 for h in hits) == 59
    assert sum(hits) == intended_reuse(sample, 128)["reused_tokens"]


def test_synth_is_seeded() -> None:
    rows = read_trace(SAMPLE)
    a = jsonl_bytes(synthesize(rows, SynthPlan(2, 60, 0, 128)))
    b = jsonl_bytes(synthesize(rows, SynthPlan(2, 60, 0, 128)))
    c = jsonl_bytes(synthesize(rows, SynthPlan(2, 60, 1, 128)))
    assert a == b and a != c


def test_synth_keeps_the_sources_statistics(tmp_path: Path) -> None:
    """At 10 req/s over 60 s (600 requests): the rate exactly, the reuse ratio within 0.03,
    the length medians within 10% and the share of same-ms arrivals within 0.1 of the
    source's."""
    rows = read_trace(SAMPLE)
    inside, span = choose_window(rows, None, None)
    plan = SynthPlan(10, 60, 0, 128)
    synthetic = synthesize(inside, plan)
    path = tmp_path / "s.jsonl"
    path.write_bytes(jsonl_bytes(synthetic))
    back = read_trace(path)  # a valid Mooncake trace
    assert len(back) == 600 and back[0].timestamp == 0 and back[-1].timestamp < 60000
    src = summarize(inside, span, StatsOptions(block_tokens=128))
    syn = synthetic_stats(back, plan)
    assert syn.rate == 10.0
    assert src.reuse is not None and syn.reuse is not None
    assert src.reuse["reuse_ratio"] is not None and syn.reuse["reuse_ratio"] is not None
    assert abs(syn.reuse["reuse_ratio"] - src.reuse["reuse_ratio"]) <= 0.03
    assert syn.reuse["requests_with_reuse"] >= 0.9 * 600
    for a, b in ((src.input, syn.input), (src.output, syn.output)):
        assert a is not None and b is not None
        assert abs(b.quantiles[50] - a.quantiles[50]) <= 0.1 * a.quantiles[50]

    def same_ms(rs: list[TraceRow]) -> float:
        return sum(x.timestamp == y.timestamp for x, y in pairwise(rs)) / (len(rs) - 1)

    assert abs(same_ms(back) - same_ms(rows)) <= 0.1
    # every request's lengths are one source request's pair
    pairs = {(r.input_length, r.output_length) for r in rows}
    assert all((r.input_length, r.output_length) in pairs for r in back)


def test_synth_at_twice_the_samples_rate_halves_its_gaps_and_keeps_its_reuse() -> None:
    src = read_trace(SAMPLE)
    rate = len(src) / (src[-1].timestamp / 1000)  # the sample's recorded rate, 60 / 57 s

    def mean_gap(rows: list[TraceRow]) -> float:
        return (rows[-1].timestamp - rows[0].timestamp) / (len(rows) - 1)

    reuse = intended_reuse(src, 128)["reuse_ratio"]
    assert reuse is not None
    for seed in range(5):  # 1,263 requests over 600 s, from each of five seeds
        rows = synthesize(src, SynthPlan(2 * rate, 600, seed, 128))
        assert mean_gap(rows) == pytest.approx(mean_gap(src) / 2, rel=0.05)
        assert intended_reuse(rows, 128)["reuse_ratio"] == pytest.approx(reuse, rel=0.05)


def test_synth_of_a_plain_trace_and_refusals() -> None:
    plain = [TraceRow(t, 50, 5, None, i) for i, t in enumerate((0, 0, 1000, 3000), 1)]
    synthetic = synthesize(plain, SynthPlan(1, 10, 0, 512))
    assert len(synthetic) == 10 and all(r.hash_ids is None for r in synthetic)
    assert synthetic_stats(synthetic, SynthPlan(1, 10, 0, 512)).reuse is None
    with pytest.raises(ServelabError, match="at least 2"):
        synthesize(plain[:1], SynthPlan(1, 10))
    with pytest.raises(ServelabError, match="one instant"):
        synthesize([plain[0], plain[1]], SynthPlan(1, 10))
    with pytest.raises(ServelabError, match="--rate 0"):
        synthesize(plain, SynthPlan(0, 10))


def test_synth_cli_writes_and_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synth.jsonl"
    argv = ["trace", "synth", str(SAMPLE), "--out", str(out), "--rate", "2", "--duration", "30"]
    assert main([*argv, "--block-tokens", "128", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    data = out.read_bytes()
    assert len(read_trace(out)) == 60
    assert "rate (req/s)                   1.053             2.000" in text
    assert "reuse ratio                   0.4992" in text
    pin = yaml.safe_load(text.split(f"wrote {out}\n", 1)[1])["workload"]["trace"]
    assert pin == {
        "path": str(out),
        "sha256": hashlib.sha256(data).hexdigest(),
        "block_tokens": 128,
        "start_s": 0,
        "duration_s": 30,
    }
    assert json.loads(data.splitlines()[0])["timestamp"] == 0
    assert main([*argv, "--window", "100:10"]) == 2
    assert "no request in it" in capsys.readouterr().err


def test_stats_span_counts_a_window_without_length() -> None:
    st = summarize(rows_at(0, 0), Span(Fraction(0), Fraction(0), "x", True), StatsOptions())
    assert st.rate is None and st.bins[0].requests == 2 and st.bins[0].rate is None


def test_stats_cli_counts_a_burstgpt_traces_failed_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n"
        "6,ChatGPT,200,0,200,Conversation log\n"
        "65,ChatGPT,300,30,330,Conversation log\n"
    )
    assert main(["trace", "stats", str(path), "--max-model-len", "300"]) == 0
    out = capsys.readouterr().out
    assert "3 requests, 0.05 req/s; failed (recorded without response): 1" in out
    assert "  input               100      300      300      300      200.0" in out
    assert "as recorded                     1 of 2 (50.0%)" in out
    assert "prefix reuse: no prefix ids: no reuse recorded" in out
