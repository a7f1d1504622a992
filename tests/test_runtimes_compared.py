"""Runtimes compared in one experiment (servelab.analysis.runtimes): every level x metric in three
words (SAME, DIFFERENT, UNKNOWN), the family's error rate held over levels x metrics x looks, the
headline from the words, UNKNOWN without interleaved rounds; and the simulation of the family's
error rate (benchmarks/bench_samehost.py)."""

from __future__ import annotations

import gzip
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from analysis_fixtures import servelab_point

from servelab.analysis.equivalence import family_alpha
from servelab.analysis.pipeline import analysis_section, analyze
from servelab.analysis.runtimes import FORMAT_VERSION, headline, runtimes_section
from servelab.design.stopping import StoppingRule
from servelab.store.jsonio import read_json, write_json

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_samehost as bench  # noqa: E402

LEVELS = (1, 4, 8)
RULE = StoppingRule(3, 5, 0.05)


def ab_tree(
    tmp: Path,
    b_over_a: dict[tuple[int, str], tuple[float, float]],
    rounds: int = 3,
    interleaved: bool = True,
    seed: int = 0,
) -> Path:
    """Two configurations on two runtimes (launch.json's locks differ), `rounds` rounds at
    LEVELS. B's throughput and TTFT are A's times (factor, log SD of the round-to-round noise)
    per (level, "tput" | "ttft"), (1, 0) where absent; A's vary 5% from round to round, shared by
    B's round (the host's speed that day)."""
    exp = tmp / "exp"
    rng = random.Random(seed)
    for r in range(1, rounds + 1):
        for c in LEVELS:
            day = math.exp(rng.gauss(0, 0.05))
            tput, ttft = 100.0 * day, 20.0 * c / day  # 4 s a point: every check passes
            ft, st = b_over_a.get((c, "tput"), (1.0, 0.0))
            fl, sl = b_over_a.get((c, "ttft"), (1.0, 0.0))
            servelab_point(exp, "a", r, c, tput, ttft, n=4)
            b_tput = tput * ft * math.exp(rng.gauss(0, st))
            servelab_point(exp, "b", r, c, b_tput, ttft * fl * math.exp(rng.gauss(0, sl)), n=4)
            for sc in ("a", "b"):  # the launch each point was measured on, as the sweep says
                path = exp / "raw" / sc / f"rep{r:02d}" / f"c{c:04d}" / "point.json"
                write_json(path, {**read_json(path), "launch": r if interleaved else 1})
    launches = []
    for i, (sc, lock, version) in enumerate((("a", "1", "0.31.0"), ("b", "2", "0.32.0"))):
        server = exp / "server" / sc
        write_json(server / "capacity.json", {"version": version, "server_config": sc})
        write_json(
            server / "launch.json",
            {
                "launch": rounds if interleaved else 1,
                "server_config": sc,
                "command": ["python", "-m", "vllm"],
                "args": {},
                "host": "127.0.0.1",
                "port": 8000 + i,
                "pid": 1,
                "started_epoch_ns": 1,
                "ready_s": 1.0,
                "runtime_lock_sha256": lock * 64,
            },
        )
        if interleaved:  # as servelab.measure.sequential records them: the look's round
            launches += [
                {
                    "round": max(k, RULE.min_rounds),
                    "server_config": sc,
                    "launch": k,
                    "ready_s": 1.0,
                    "lock_waited_s": 0.0,
                }
                for k in range(1, rounds + 1)
            ]
    for sc in ("a", "b"):
        write_json(
            exp / "raw" / sc / "run.json",
            {
                "format_version": 1,
                "server_config": sc,
                "status": "complete",
                "points": len(LEVELS) * rounds,
                "launches": rounds if interleaved else 1,
                "plan": [],
                "sequential": {
                    "rule": RULE.to_json(),
                    "rounds": rounds,
                    "stopped": "maximum",
                    "round_s": [1.0],
                    "launches": launches,
                    "orderings": [],
                    "looks": [],
                },
            },
        )
    return exp


def compared(tmp: Path, exp: Path) -> dict[str, Any]:
    res = analyze(exp, tmp / "out", analysis_section({}), figures=False)
    doc: dict[str, Any] = res.runtimes
    return doc


def by(doc: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(r["level"], r["metric"]): r for r in doc["pairs"][0]["rows"]}


def test_the_words_are_the_familys_over_levels_metrics_and_looks(tmp_path: Path) -> None:
    """3 levels x 3 metrics x 3 looks: each interval at 1 - 2 x 0.05 / 27. B 30% slower at c=8,
    within half a percent of A elsewhere."""
    noise = 0.003
    spec = {(c, m): (1.0, noise) for c in LEVELS for m in ("tput", "ttft")}
    spec[(8, "tput")] = (0.7, noise)
    spec[(8, "ttft")] = (1.0 / 0.7, noise)
    doc = compared(tmp_path, ab_tree(tmp_path, spec, rounds=5))
    assert doc["format_version"] == FORMAT_VERSION == 2
    assert (doc["decisions"], doc["looks"]) == (9, 3)
    assert doc["interval_alpha"] == pytest.approx(family_alpha(0.05, 9, 3))
    assert doc["interleaved"] is True and doc["margin_pct"] == 10.0
    assert "Bonferroni over points x metrics x looks" in doc["method"]
    rows = by(doc)
    slow = rows[8, "output_throughput"]
    assert slow["answer"] == "DIFFERENT (slower)" and slow["word"] == "DIFFERENT"
    assert slow["ratio"] is not None and slow["ci_high"] < 1 / 1.1  # B / A, wholly outside
    assert rows[8, "mean_ttft_ms"]["answer"] == "DIFFERENT (slower)"
    ttft = rows[8, "mean_ttft_ms"]
    assert ttft["ratio"] > 1.1 and ttft["ratio"] == pytest.approx(1 / ttft["speed"])
    assert rows[1, "output_throughput"]["answer"] == "SAME"
    assert rows[4, "mean_ttft_ms"]["answer"] == "SAME"
    # the paired test's p stays beside the word, for information
    assert slow["p_value"] is not None and slow["p_value"] < 0.05
    names = {c: f"c={c}" for c in LEVELS}
    text = "\n".join(runtimes_section(doc, names))  # type: ignore[arg-type]
    assert "### Is b (vLLM 0.32.0) slower than a (vLLM 0.31.0)?" in text
    assert "Yes: slower by more than 10% in output_throughput at c=8; mean_ttft_ms at c=8" in text
    assert "9 decisions x 3 looks" in text and "p (unadjusted)" in text


def test_an_unadjusted_p_under_alpha_is_not_the_answer(tmp_path: Path) -> None:
    """The version A/B example's case: c=1's TTFT 8% higher on B with some noise, p < 0.05
    for the paired test alone, yet 1 of 9 decisions read at 3 looks: UNKNOWN, and the
    headline says so instead of "No"."""
    spec = {(1, "ttft"): (1.08, 0.03)}
    doc = compared(tmp_path, ab_tree(tmp_path, spec, rounds=3, seed=3))
    row = by(doc)[1, "mean_ttft_ms"]
    assert row["p_value"] is not None and row["p_value"] < 0.05
    assert row["answer"] == "UNKNOWN" and row["word"] == "UNKNOWN"
    names = {c: f"c={c}" for c in LEVELS}
    lead = headline(doc["pairs"][0]["rows"], doc["margin_pct"], names)
    assert lead.startswith("Unknown: ") and "UNKNOWN" in lead
    assert not lead.startswith("No")


def test_without_interleave_every_row_is_unknown_and_says_why(tmp_path: Path) -> None:
    """Each side's rounds on one launch: pseudo-replication. Even a 30% slowdown that the
    interleaved plan calls DIFFERENT is UNKNOWN here, naming sweep.repeats.interleave."""
    spec = {(c, "tput"): (0.7, 0.003) for c in LEVELS}
    doc = compared(tmp_path, ab_tree(tmp_path, spec, rounds=5, interleaved=False))
    assert doc["interleaved"] is False
    rows = doc["pairs"][0]["rows"]
    assert len(rows) == 9 and {r["answer"] for r in rows} == {"UNKNOWN"}
    assert all("sweep.repeats.interleave: true" in r["why"] for r in rows)
    assert all("\n" not in r["why"] for r in rows)
    text = "\n".join(runtimes_section(doc, {c: f"c={c}" for c in LEVELS}))  # type: ignore[arg-type]
    assert "Every row is UNKNOWN: not interleaved" in text
    assert "Unknown: 9 of 9 answers UNKNOWN (not interleaved" in text
    # interleaved, the same data is decided
    again = compared(tmp_path / "i", ab_tree(tmp_path / "i", spec, rounds=5))
    assert by(again)[8, "output_throughput"]["answer"] == "DIFFERENT (slower)"


def test_the_json_keeps_format_1s_keys_and_its_schema(tmp_path: Path) -> None:
    doc = compared(tmp_path, ab_tree(tmp_path, {}, rounds=3))
    row = doc["pairs"][0]["rows"][0]
    for key in ("level", "metric", "n", "ratio", "ci_low", "ci_high", "p_value", "answer"):
        assert key in row
    for key in ("axis", "alpha", "threshold_pct", "pairs"):
        assert key in doc
    schema = read_json(REPO / "src" / "servelab" / "schemas" / "runtimes.schema.json")
    jsonschema.Draft202012Validator(schema).validate(doc)
    bad = {**doc, "format_version": 1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)


def test_the_same_data_gives_the_same_bytes(tmp_path: Path) -> None:
    exp = ab_tree(tmp_path, {(4, "tput"): (0.95, 0.02)}, rounds=4)
    analyze(exp, tmp_path / "o1", analysis_section({}), figures=False)
    analyze(exp, tmp_path / "o2", analysis_section({}), figures=False)
    one = (tmp_path / "o1" / "report.md").read_bytes()
    assert one == (tmp_path / "o2" / "report.md").read_bytes()
    assert b"## Runtimes compared" in one


def test_the_family_error_rate_stays_under_alpha() -> None:
    """benchmarks/bench_samehost.py on 400 studies per case: identical runtimes, 3 levels x 3
    metrics, rounds 3 to 5: the chance of any wrong DIFFERENT, at any look, is at most alpha;
    with a true 20% slowdown, of any SAME likewise; the unadjusted paired tests call something
    in far more studies where nothing differs (about 1 - 0.95^9)."""
    for i, spread in enumerate((0.03, 0.08)):
        null = bench.simulate(np.random.default_rng([5, i]), 400, spread, 0.0)
        assert null.wrong_any_look <= bench.ALPHA and null.wrong_final <= bench.ALPHA
        assert null.paired > 0.25
        slow = bench.simulate(np.random.default_rng([6, i]), 400, spread, -math.log(1.2))
        assert slow.wrong_any_look <= bench.ALPHA
    # at the quiet spread the words decide rows: a check that could fail if they never did
    quiet = bench.simulate(np.random.default_rng(7), 400, 0.03, -math.log(1.2))
    assert quiet.decided > 0.2


def with_output_ids(exp: Path, differ: Callable[[str, int, int, int], bool]) -> None:
    """Every request of `exp` with the token ids of its answer: the same for a prompt on both
    sides, except where `differ(config, round, level, index)`, whose answer parts at token 3."""
    for path in sorted(exp.glob("raw/*/rep*/c*/requests.jsonl.gz")):
        sc, rep, c = path.parts[-4], int(path.parts[-3][3:]), int(path.parts[-2][1:])
        with gzip.open(path, "rt") as fh:
            rows = [json.loads(line) for line in fh]
        for i, row in enumerate(rows):
            ids = [rep, c, i, 7, 7]
            row["output_ids"] = ids[:2] + [99] + ids[3:] if differ(sc, rep, c, i) else ids
        with gzip.open(path, "wt") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


def test_the_runtimes_answer_says_when_the_completions_differ(tmp_path: Path) -> None:
    """B answers the first prompt of every c=8 point otherwise (3 of 36 completions): the
    headline says so beside the speed, each pair carries its outputs, and the report's "Same
    outputs" lists the pair; a claim comparing the two configurations says it too. Under a 10%
    threshold the verdicts stand as they were."""
    spec = {(8, "tput"): (1.5, 0.003)}
    exp = ab_tree(tmp_path, spec, rounds=3)
    with_output_ids(exp, lambda sc, rep, c, i: sc == "b" and c == 8 and i == 0)
    claim = "throughput[config=b,c=8] > throughput[config=a,c=8]"
    res = analyze(exp, tmp_path / "out", analysis_section({"claims": [claim]}), figures=False)
    assert res.runtimes is not None
    block = res.runtimes["pairs"][0]["same_outputs"]
    assert (block["pairs"], block["identical"], block["first_differing_token_min"]) == (36, 33, 3)
    assert block["beyond"] is True and block["max_differing_outputs_pct"] == 0
    schema = read_json(REPO / "src" / "servelab" / "schemas" / "runtimes.schema.json")
    jsonschema.Draft202012Validator(schema).validate(res.runtimes)
    report = (tmp_path / "out" / "report.md").read_text()
    headline = next(line for line in report.splitlines() if line.startswith("No: faster"))
    assert headline.endswith("the same within 10% at 7 more, but 8% of completions differ.")
    assert (
        "Same outputs: 33 of 36 completions identical (92%); 3 differ, first at token 3" in report
    )
    assert "## Same outputs" in report and "- b against a: Same outputs: 33 of 36" in report
    assert f"| `{claim}` | holds, but 8% of completions differ |" in report
    lenient = analysis_section({"claims": [claim], "max_differing_outputs_pct": 10})
    analyze(exp, tmp_path / "o10", lenient, figures=False)
    calm = (tmp_path / "o10" / "report.md").read_text()
    assert "completions differ" not in calm and f"| `{claim}` | holds |" in calm
    assert "Same outputs: 33 of 36 completions identical (92%)" in calm


def test_without_output_ids_the_comparison_says_not_recorded(tmp_path: Path) -> None:
    exp = ab_tree(tmp_path, {}, rounds=3)
    res = analyze(exp, tmp_path / "out", analysis_section({}), figures=False)
    assert res.runtimes is not None and "same_outputs" not in res.runtimes["pairs"][0]
    assert res.same_outputs is None
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Same outputs: not recorded (workload.record_output_ids is off" in report
    assert "## Same outputs" not in report
