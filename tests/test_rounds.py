"""Sequential sweeps without a server: the plan in the config, the looks the analysis
recomputes from raw data (claims.json, rounds.json, the report), the round-by-round loop of
servelab.measure.sequential with its measuring stubbed out by points written from known values, and a
reproduction judging each side with the rule it was measured under."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from analysis_fixtures import servelab_point
from experiment_fixtures import measure_job

from servelab.analysis.pipeline import analyze, load_dataset
from servelab.config import validate
from servelab.design.schedule import plan
from servelab.design.stopping import StoppingRule
from servelab.errors import ServelabError
from servelab.experiment import Experiment, RoundsSection
from servelab.measure import sequential as rounds_mod
from servelab.measure.sweep import SweepJob
from servelab.reproduce import reference_orderings
from servelab.reproduce.checks import REPRODUCED, analyse, claim_rows
from servelab.store.jsonio import load_schema, write_json

REPO = Path(__file__).resolve().parents[1]
CLEAR = "throughput[config=a,c=4] > 1.5 * throughput[config=b,c=4]"  # 100 vs 1.5 * 50
NULL = "throughput[config=a,c=1] > throughput[config=a,c=4]"  # 100 vs 100
SHAPE = "knee(config=b)"
MEANS = {("a", 1): 100.0, ("a", 4): 100.0, ("b", 1): 50.0, ("b", 4): 50.0}


def experiment(tmp: Path, claims: list[str], **plan: Any) -> Experiment:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp)
    cfg["experiment"] = "seq"
    cfg["server"]["configs"] = [{"name": "a", "args": {}}, {"name": "b", "args": {}}]
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": {"min": 3, "max": 5, **plan}}
    cfg["analysis"] = {"claims": claims}
    return validate(cfg)


def write_round(exp_dir: Path, r: int, cv: float = 0.02) -> None:
    """Round r of every point: known means, a 2% lognormal-ish noise fixed by the round."""
    rng = random.Random(1000 + r)
    for (sc, c), mean in sorted(MEANS.items()):
        servelab_point(exp_dir, sc, r, c, mean * (1 + cv * rng.gauss(0, 1)), 100.0)


def sequential_tree(tmp: Path, rounds: int, rule: StoppingRule, stopped: str) -> Path:
    exp = tmp / "exp"
    for r in range(1, rounds + 1):
        write_round(exp, r)
    for sc in ("a", "b"):
        write_json(
            exp / "raw" / sc / "run.json",
            {
                "format_version": 1,
                "server_config": sc,
                "status": "complete",
                "points": 2 * rounds,
                "launches": 1,
                "plan": [],
                "sequential": {
                    "rule": rule.to_json(),
                    "rounds": rounds,
                    "stopped": stopped,
                    "round_s": [1.0],
                    "looks": [],
                },
            },
        )
    return exp


def test_a_plan_in_the_config_and_its_errors(tmp_path: Path) -> None:
    exp = experiment(tmp_path, [CLEAR], budget_s=600)
    assert exp.sweep.rounds == RoundsSection(min=3, max=5, budget_s=600.0)
    assert exp.sweep.most_repeats == 5
    assert rounds_mod.stopping_rule(exp) == StoppingRule(3, 5, 0.05, 600.0)
    assert (
        validate({**exp.to_dict(), "sweep": {"concurrency": [1], "repeats": 3}}).sweep.rounds
        is None
    )
    bad = [
        ({"min": 3, "max": 2}, "sweep.repeats: max (2) is below min (3); give max >= min"),
        ({"min": 1, "max": 2}, "sweep.repeats: min: 1 is less than the minimum of 2"),
        ({"min": 2, "most": 4}, "'most' was unexpected"),
    ]
    for bad_plan, msg in bad:
        cfg = {**exp.to_dict(), "sweep": {"concurrency": [1], "repeats": bad_plan}}
        with pytest.raises(ServelabError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            validate(cfg)


def test_looks_decide_a_clear_claim_and_leave_a_null_one_open(tmp_path: Path) -> None:
    rule = StoppingRule(3, 5, 0.05)
    exp = sequential_tree(tmp_path, 5, rule, "maximum")
    opts = experiment(tmp_path, [CLEAR, NULL, SHAPE]).analysis
    res = analyze(exp, tmp_path / "out", opts, figures=False)
    by = {c["claim"]: c for c in res.claims}
    clear = by[CLEAR]
    # decided at the first look, and it keeps that look's verdict and evidence
    assert clear["verdict"] == "holds"
    assert clear["evidence"]["sequential"]["round"] == 3 and clear["evidence"]["n"] == 3
    assert clear["evidence"]["sequential"]["df"] == 2
    assert clear["evidence"]["sequential"]["p_value"] < rule.look_alpha(3)
    null = by[NULL]
    assert null["verdict"] == "inconclusive"
    assert null["reason"] == "inconclusive: open after 5 rounds (the plan's maximum of rounds)"
    assert null["evidence"]["sequential"]["round"] == 5 and null["evidence"]["n"] == 5
    assert "sequential" not in by[SHAPE]["evidence"]  # judged on means: never open

    rec = json.loads((tmp_path / "out" / "rounds.json").read_text())
    jsonschema.validate(rec, load_schema("rounds"))
    assert rec["rounds"] == 5 and rec["stopped"] == "maximum"
    assert [(lk["round"], lk["decided"], lk["open"]) for lk in rec["looks"]] == [
        (3, 2, 1),
        (4, 2, 1),
        (5, 2, 1),
    ]
    first = {c["claim"]: c for c in rec["looks"][0]["claims"]}
    assert first[CLEAR]["decided_round"] == 3 and first[NULL]["state"] == "open"
    assert first[SHAPE]["test"] is None
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Rounds" in report and "Measured 5 rounds; stopped: maximum." in report
    assert f"`{CLEAR}`: holds (t = " in report
    # the same bytes again: a pure function of the raw data
    again = analyze(exp, tmp_path / "out2", opts, figures=False)
    assert again.rounds == res.rounds
    assert (tmp_path / "out2" / "claims.json").read_bytes() == (
        tmp_path / "out" / "claims.json"
    ).read_bytes()


def test_a_fixed_design_has_no_looks(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for r in (1, 2, 3):
        write_round(exp, r)
    opts = experiment(tmp_path, [CLEAR]).analysis
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rounds.json").write_text("{}")  # stale, from a sequential run
    res = analyze(exp, tmp_path / "out", opts, figures=False)
    assert res.rounds is None and not (tmp_path / "out" / "rounds.json").exists()
    assert "sequential" not in res.claims[0]["evidence"]
    assert "## Rounds" not in (tmp_path / "out" / "report.md").read_text()


class Measured:
    """SweepJob.measure_missing, stubbed: writes the points of rounds up to k from `means`
    (cell -> (throughput, mean TTFT ms)) with a 2% noise fixed by the round, and counts the
    calls; the plan as the real one returns it."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        means: dict[tuple[str, int], tuple[float, float]] | None = None,
    ) -> None:
        self.calls: list[tuple[str, int]] = []
        cells = means or {cell: (tput, 100.0) for cell, tput in MEANS.items()}

        def fake(job: SweepJob, repeats: int) -> Any:
            self.calls.append((job.sc, repeats))
            for r in range(1, repeats + 1):
                rng = random.Random(1000 + r)
                for (sc, c), (tput, ttft) in sorted(cells.items()):
                    noise = 1 + 0.02 * rng.gauss(0, 1)  # the same draws as write_round
                    if sc == job.sc:
                        servelab_point(job.paths.root, sc, r, c, tput * noise, ttft / noise)
            sw = job.exp.sweep
            return plan(sw.concurrency, repeats, sw.order, sw.order_seed)

        monkeypatch.setattr(SweepJob, "measure_missing", fake)


def run(
    tmp_path: Path,
    exp: Experiment,
    configs: Sequence[str] = ("a", "b"),
    orderings: Sequence[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    said: list[str] = []
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path, say=said.append)
    paths = job.paths
    rec = rounds_mod.run_rounds(job, reference_orderings=orderings)
    for sc in configs:
        run_json = json.loads(paths.run(sc).read_text())
        jsonschema.validate(run_json, load_schema("run"))
        points = len(exp.sweep.concurrency) * rec["rounds"]
        assert run_json["sequential"] == rec and run_json["points"] == points
    return rec, said


def test_rounds_stop_when_every_claim_is_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Measured(monkeypatch)
    rec, said = run(tmp_path, experiment(tmp_path, [CLEAR, SHAPE]))
    assert m.calls == [("a", 3), ("b", 3)]  # the first look decided everything
    assert rec["rounds"] == 3 and rec["stopped"] == "decided"
    assert said[-1] == "stopped after round 3: every question decided"
    assert "look after round 3: 2 of 2 questions decided" in said


def test_rounds_go_on_to_the_maximum_while_a_claim_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Measured(monkeypatch)
    rec, said = run(tmp_path, experiment(tmp_path, [CLEAR, NULL]))
    assert m.calls == [("a", 3), ("b", 3), ("a", 4), ("b", 4), ("a", 5), ("b", 5)]
    assert rec["rounds"] == 5 and rec["stopped"] == "maximum"
    assert [lk["open"] for lk in rec["looks"]] == [1, 1, 1]
    assert any(s.startswith("look after round 4: 1 of 2 questions decided; open: ") for s in said)
    # the analysis of the same raw data reads the same looks
    ds = load_dataset(tmp_path / "seq")
    assert ds.sequential == rec


def test_a_budget_stops_before_the_next_round_would_overrun_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Measured(monkeypatch)
    rec, said = run(tmp_path, experiment(tmp_path, [NULL], budget_s=0.001))
    assert m.calls == [("a", 3), ("b", 3)]
    assert rec["stopped"] == "budget" and rec["rounds"] == 3
    assert said[-1] == "stopped after round 3: the time budget"
    res = analyze(tmp_path / "seq", tmp_path / "out", experiment(tmp_path, [NULL]).analysis)
    assert res.claims[0]["reason"] == "inconclusive: open after 3 rounds (the time budget)"


def test_a_reproduction_judges_each_side_with_its_own_rule(tmp_path: Path) -> None:
    rule = StoppingRule(3, 5, 0.05)
    ref = load_dataset(sequential_tree(tmp_path / "ref", 5, rule, "maximum"))
    new_dir = tmp_path / "new" / "exp"
    for r in (1, 2, 3):
        write_round(new_dir, r)
    opts = experiment(tmp_path, [CLEAR, NULL]).analysis
    rows = {
        r["claim"]: r
        for r in claim_rows(
            analyse(ref, opts), analyse(load_dataset(new_dir), opts), opts, [CLEAR, NULL]
        )
    }
    assert rows[CLEAR]["reference_verdict"] == "holds" and rows[CLEAR]["verdict"] == REPRODUCED
    # open in the reference by its rule: nothing to reproduce
    assert rows[NULL]["reference_verdict"] == "inconclusive"


def test_a_reference_adds_the_orderings_a_reproduction_will_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sequential run against the committed release asks its judged orderings beside the
    claims, measured (stubbed) at the release's own means: they are decided and recorded as
    orderings, and claims.json keeps the claims alone."""
    release = REPO / "evidence" / "quickstart-cpu" / "v6"
    rows = list(csv.DictReader((release / "tables" / "summary.csv").open()))
    mean = {
        (r["server_config"], int(r["concurrency"]), r["metric"]): float(r["mean"]) for r in rows
    }
    configs = sorted({sc for sc, _, _ in mean})
    levels = sorted({c for _, c, _ in mean})
    means = {
        (sc, c): (mean[(sc, c, "output_throughput")], mean[(sc, c, "mean_ttft_ms")])
        for sc in configs
        for c in levels
    }
    claim = "throughput[config=max-num-seqs-8,c=16] > 1.5 * throughput[config=max-num-seqs-1,c=16]"
    cfg = experiment(tmp_path, [claim]).to_dict()
    cfg["server"]["configs"] = [{"name": sc, "args": {}} for sc in configs]
    cfg["sweep"]["concurrency"] = levels
    cfg["reference"] = str(release)
    exp = validate(cfg)
    Measured(monkeypatch, means)
    # the caller (scripts/sweep.py) reads the reference's orderings: the sweep does not
    expected = reference_orderings(release, exp.reproduction)
    rec, said = run(tmp_path, exp, configs, expected)
    assert expected and rec["orderings"] == expected
    assert f"and the {len(expected)} orderings the reproduction will judge: " in said[1]
    kinds = {c["claim"]: c["kind"] for c in rec["looks"][-1]["claims"]}
    assert kinds == {claim: "claim", **{q: "ordering" for q in expected}}
    assert rec["stopped"] == "decided" and rec["looks"][-1]["open"] == 0
    res = analyze(tmp_path / "seq", tmp_path / "out", exp.analysis, figures=False)
    assert [c["claim"] for c in res.claims] == [claim]
    assert res.rounds["orderings"] == expected and res.rounds["looks"] == rec["looks"]


def test_the_sweep_does_not_read_the_reference() -> None:
    """The sequential sweep (a measuring stage) is given the reference's orderings by its
    caller (scripts/sweep.py); it never imports the reproduction."""
    from test_layers import graph

    found = [
        t
        for t in graph()["servelab.measure.sequential"]
        if t.split(".")[:2] == ["servelab", "reproduce"]
    ]
    assert found == []
