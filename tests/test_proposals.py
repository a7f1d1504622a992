"""Proposals (analysis.proposals) and the confirmation they call for (servelab.confirm):
known answers on trees built to the published V100 study and to the CPU quickstart, and the
confirmation experiment derived from them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from analysis_fixtures import (
    V100_MNS1,
    V100_MNS12,
    servelab_tree,
    v100_server_log,
    vllm_bench_tree,
)

from servelab.analysis.confirmation import proposal_verdict
from servelab.analysis.pipeline import analyze
from servelab.cli import main
from servelab.config import read_file, validate
from servelab.confirm import (
    Plan,
    Workflow,
    plan_confirmation,
    run_confirm,
    seed_reused,
    write_config,
)
from servelab.errors import ServelabError
from servelab.evidence.schemas import load_schema
from servelab.experiment import Experiment
from servelab.launch.serverlog import parse_capacity
from servelab.store.jsonio import read_json, write_json

REPO = Path(__file__).resolve().parents[1]
CLAIM_4 = (
    "throughput[config=max-num-seqs-1.max-num-seqs-8,c=4] > "
    "1.5 * throughput[config=max-num-seqs-1,c=4]"
)


def _kind(diags: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in diags if d["kind"] == kind]


def test_the_seed_tree_proposes_max_num_seqs_12(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The published V100 run at --max-num-seqs 1, as a `vllm bench serve` tree with its
    startup log (12.90x): both diagnoses propose --max-num-seqs 12, judged where it could
    triple throughput (concurrency 4 and 8); a dry run: the tree has no config to derive a
    confirmation from."""
    root = vllm_bench_tree(tmp_path / "v100-mns1", V100_MNS1, server_log=v100_server_log(1, [1, 2]))
    out = tmp_path / "out"
    assert main(["analyze", str(root), "--out", str(out), "--no-figures"]) == 0
    printed = capsys.readouterr().out
    diags = read_json(out / "diagnoses.json")
    jsonschema.Draft202012Validator(load_schema("diagnoses")).validate(diags)
    for kind in ("serialized", "kv_headroom_unused"):
        (d,) = _kind(diags, kind)
        p = d["proposal"]
        assert p["change"] == {"max-num-seqs": 12}
        assert p["config"] == "v100-mns1.max-num-seqs-12"
        assert p["concurrency"] == [4, 8]
        assert p["claims"] == [
            f"throughput[config=v100-mns1.max-num-seqs-12,c={c}] > "
            f"1.5 * throughput[config=v100-mns1,c={c}]"
            for c in (4, 8)
        ]
        assert p["tryable"] is True
    assert (
        "    proposal: --max-num-seqs 12 on v100-mns1; expected: output throughput at " in printed
    )
    report = (out / "report.md").read_text()
    assert "  Proposal: --max-num-seqs 12 on v100-mns1; expected:" in report
    # operating points are reported, not run
    past = _kind(diags, "past_knee")[0]["proposal"]
    assert past["operate_at"] == {"concurrency": 1} and past["tryable"] is False
    assert "measured by this sweep: nothing to confirm" in printed


def test_a_dip_outside_the_captured_graphs_proposes_capture_sizes(tmp_path: Path) -> None:
    """The V100 run at --max-num-seqs 12 (graphs captured for batch 1 and 2, a dip at 3):
    capture sizes that add every measured batch above 2, up to --max-num-seqs."""
    root = vllm_bench_tree(
        tmp_path / "v100-mns12", V100_MNS12, server_log=v100_server_log(12, [1, 2])
    )
    res = analyze(root, tmp_path / "out", figures=False)
    (dip,) = _kind(res.diagnoses, "non_monotonic")
    p = dip["proposal"]
    assert json.loads(p["change"]["compilation-config"]) == {
        "cudagraph_capture_sizes": [1, 2, 3, 4, 6, 8, 12]
    }
    assert p["config"] == "v100-mns12.capture-12"
    assert p["claims"] == [
        "throughput[config=v100-mns12.capture-12,c=3] > throughput[config=v100-mns12,c=3]"
    ]
    assert not _kind(res.diagnoses, "kv_headroom_unused")  # 12 already uses the 12.90x


def test_diagnoses_without_a_remedy_say_why(tmp_path: Path) -> None:
    """A serialized server whose log does not say what the KV cache fits: no value to
    propose, and the diagnosis says so."""
    spec = {c: [(45.5, 700.0 * c)] for c in (1, 2, 4, 8)}
    exp = servelab_tree(
        tmp_path / "exp", {"x": spec}, {"x": {"non_default_args": {"max_num_seqs": 1}}}
    )
    res = analyze(exp, tmp_path / "out", figures=False)
    (ser,) = _kind(res.diagnoses, "serialized")
    assert "proposal" not in ser
    assert "does not say how many sequences the KV cache fits" in ser["no_remedy"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "No remedy: the startup log does not say how many sequences" in report


def test_a_proposal_with_no_level_to_judge_is_not_tryable(tmp_path: Path) -> None:
    """--max-num-seqs 2 -> 8 measured only up to concurrency 4: nowhere could the change
    triple throughput, so no claim is written and the proposal is not run."""
    spec = {c: [(45.5, 700.0 * c)] for c in (1, 2, 4)}
    cap = parse_capacity(v100_server_log(2, [1, 2]))
    exp = servelab_tree(tmp_path / "exp", {"x": spec}, {"x": cap})
    res = analyze(exp, tmp_path / "out", figures=False)
    (kv,) = _kind(res.diagnoses, "kv_headroom_unused")
    p = kv["proposal"]
    assert p["change"] == {"max-num-seqs": 12} and p["concurrency"] == [] and p["claims"] == []
    assert p["tryable"] is False and "no measured concurrency reaches 6" in p["not_tried"]


def _quickstart(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    raw = read_file(REPO / "config" / "experiments" / "serialized-cpu.yaml")
    raw["results_dir"] = str(tmp_path / "results")
    raw.update(changes)
    return validate(raw, "test").to_dict()


# the CPU quickstart at --max-num-seqs 1 (evidence/quickstart-cpu/v6, AMD EPYC): flat near 120
# tok/s
SERIAL = {c: [(120.0 + r, 500.0 * c) for r in (0, 1, 2)] for c in (1, 2, 4, 8, 16)}
CPU_LOG = (
    "(APIServer pid=1) INFO 12-03 08:00:00 [utils.py:253] non-default args: "
    "{'model': 'm', 'max_num_seqs': 1}\n"
    "(EngineCore pid=2) INFO 12-03 08:00:09 [kv_cache_utils.py:1708] GPU KV cache size: "
    "8,704 tokens\n"
    "(EngineCore pid=2) INFO 12-03 08:00:09 [kv_cache_utils.py:1709] Maximum concurrency for "
    "1,024 tokens per request: 8.50x\n"
)


def _diagnosed(tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    """The serialized-cpu experiment's config, its diagnoses and a bundle folder."""
    cfg = _quickstart(tmp_path)
    root = Path(cfg["results_dir"]) / cfg["experiment"]
    servelab_tree(root, {"max-num-seqs-1": SERIAL}, {"max-num-seqs-1": parse_capacity(CPU_LOG)})
    res = analyze(root, root / "analysis", Experiment.from_dict(cfg).analysis, figures=False)
    bundle = root / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"files": []}\n')
    return cfg, res.diagnoses, bundle


def test_the_confirmation_measures_both_side_by_side(tmp_path: Path) -> None:
    cfg, diags, bundle = _diagnosed(tmp_path)
    assert {d["kind"] for d in diags} >= {"serialized", "kv_headroom_unused"}
    plan = plan_confirmation(cfg, diags, bundle)
    assert [p["id"] for p in plan.tried] == ["P1"]
    p1 = plan.tried[0]
    # serialized and kv_headroom_unused propose the same change: one proposal, both named
    assert p1["diagnoses"] == ["serialized", "kv_headroom_unused"]
    assert p1["change"] == {"max-num-seqs": 8} and p1["concurrency"] == [4, 8, 16]
    derived = plan.config
    assert derived is not None
    assert derived["experiment"] == "serialized-cpu-confirm"
    assert derived["server"]["configs"] == [
        {"name": "max-num-seqs-1", "args": {"max-num-seqs": 1}},
        {"name": "max-num-seqs-1.max-num-seqs-8", "args": {"max-num-seqs": 8}},
    ]
    assert derived["server"]["args"] == cfg["server"]["args"]
    assert derived["workload"] == cfg["workload"] and derived["model"] == cfg["model"]
    assert derived["sweep"]["concurrency"] == [4, 8, 16]
    assert derived["sweep"]["repeats"] == 3 and derived["sweep"]["order"] == "latin"
    assert CLAIM_4 in derived["analysis"]["claims"]
    confirms = derived["analysis"]["confirms"]
    assert confirms["experiment"] == "serialized-cpu" and confirms["bundle"] == str(bundle)
    assert len(confirms["manifest_sha256"]) == 64
    assert derived["profile"]["enabled"] is False and derived["reference"] is None
    assert "confirm" not in derived
    # operating points (past_knee, dominated) are listed as not tried, with the reason
    assert plan.not_tried and all("operate at" in n["proposal"] for n in plan.not_tried)
    # the experiment file runs as written
    path = tmp_path / "c" / "config.yaml"
    write_config(plan, path)
    text = path.read_text()
    assert text.startswith("# The confirmation of serialized-cpu")
    assert validate(yaml.safe_load(text), "t").to_dict() == derived


def test_under_a_cluster_executor_confirm_writes_the_plan_and_measures_nothing(
    tmp_path: Path,
) -> None:
    """The confirm rule is a local rule: under the slurm executor its nested workflow would
    measure on the submitting host. It writes the experiment file, runs nothing, writes no
    record and says where to run it; the same call under the local executor runs it."""
    cfg, diags, bundle = _diagnosed(tmp_path)
    diagnoses = tmp_path / "diagnoses.json"
    write_json(diagnoses, diags)
    folder = tmp_path / "results" / "serialized-cpu-confirm"
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    said: list[str] = []
    with pytest.raises(ServelabError) as err:
        run_confirm(
            cfg, diagnoses, bundle, folder / "confirm.json", Workflow(command, "slurm"), said.append
        )
    msg = str(err.value)
    assert msg.startswith(f"{folder / 'config.yaml'}: written, not measured")
    assert "under the slurm executor is the submitting host" in msg
    assert "`snakemake --cores all confirm` with the same --configfile" in msg
    assert "\n" not in msg
    assert (folder / "config.yaml").is_file() and not (folder / "confirm.json").exists()
    assert not marker.exists() and not (folder / "model").exists()
    # locally the same call runs the workflow (which here writes no confirmation table)
    with pytest.raises(ServelabError, match="the confirmation's workflow exited with 0"):
        run_confirm(cfg, diagnoses, bundle, folder / "confirm.json", Workflow(command), said.append)
    assert marker.exists() and read_json(folder / "confirm.json")["status"] == "failed"


def test_what_cannot_be_tried_is_reported_not_run(tmp_path: Path) -> None:
    cfg, diags, bundle = _diagnosed(tmp_path)
    # a change the configuration already has
    cfg8 = json.loads(json.dumps(cfg))
    cfg8["server"]["configs"][0]["args"]["max-num-seqs"] = 8
    plan = plan_confirmation(cfg8, diags, bundle)
    assert plan.config is None and not plan.tried
    assert any("already runs with --max-num-seqs 8" in n["reason"] for n in plan.not_tried)
    # CUDA graphs on a CPU runtime
    dip = {
        "kind": "non_monotonic",
        "server_config": "max-num-seqs-1",
        "proposal": {
            "server_config": "max-num-seqs-1",
            "change": {"compilation-config": '{"cudagraph_capture_sizes":[1,2,3]}'},
            "config": "max-num-seqs-1.capture-3",
            "concurrency": [2],
            "claims": [],
            "expected": "e",
            "why": "w",
            "tryable": True,
        },
    }
    plan = plan_confirmation(cfg, [dip], bundle)
    assert plan.config is None
    assert "need a GPU runtime (runtime.device is cpu)" in plan.not_tried[0]["reason"]
    # never more than confirm.max_proposals
    other = json.loads(json.dumps(diags[0]))
    other["proposal"]["change"] = {"max-num-seqs": 4}
    other["proposal"]["config"] = "max-num-seqs-1.max-num-seqs-4"
    plan = plan_confirmation(cfg, [*diags, other], bundle, max_proposals=1)
    assert len(plan.tried) == 1
    assert any("over confirm.max_proposals (1)" in n["reason"] for n in plan.not_tried)


def test_a_reproduction_or_a_confirmation_is_not_confirmed(tmp_path: Path) -> None:
    cfg, diags, bundle = _diagnosed(tmp_path)
    plan = plan_confirmation(cfg, diags, bundle)
    assert plan.config is not None
    with pytest.raises(ServelabError, match="this experiment is a confirmation"):
        plan_confirmation(plan.config, diags, bundle)


def test_the_bundle_must_exist(tmp_path: Path) -> None:
    cfg, diags, bundle = _diagnosed(tmp_path)
    (bundle / "manifest.json").unlink()
    with pytest.raises(ServelabError, match="manifest.json: not found"):
        plan_confirmation(cfg, diags, bundle)


def test_the_confirmation_reuses_the_model_and_runtime(tmp_path: Path) -> None:
    """Records copied with their times; a model built in the diagnosing folder is served
    from there (the same path: the compile cache keys on it)."""
    src, dst = tmp_path / "a", tmp_path / "b"
    write_json(src / "model" / "servelab-model.json", {"source": "tiny", "path": "."})
    write_json(src / "runtime" / "runtime.json", {"kind": "venv"})
    assert seed_reused(src, dst) == ["model", "runtime"]
    assert read_json(dst / "model" / "servelab-model.json")["path"] == str(src / "model")
    rt = dst / "runtime" / "runtime.json"
    assert rt.stat().st_mtime == (src / "runtime" / "runtime.json").stat().st_mtime
    assert seed_reused(src, dst) == []  # already there: left as they are


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (["holds", "holds"], "confirmed"),
        (["holds", "fails"], "refuted"),
        (["holds", "inconclusive"], "inconclusive"),
        (["invalid"], "inconclusive"),
        ([], "inconclusive"),
    ],
)
def test_a_proposal_verdict(verdicts: list[str], expected: str) -> None:
    assert proposal_verdict(verdicts) == expected


def test_a_confirmation_analysis_judges_each_proposal(tmp_path: Path) -> None:
    """The confirmation's raw data analysed with its config: a verdict per proposal, the
    throughput ratio with its CI, before/after, schema-valid, in the report."""
    cfg, diags, bundle = _diagnosed(tmp_path)
    plan: Plan = plan_confirmation(cfg, diags, bundle)
    assert plan.config is not None
    after = {c: [(120.0 * min(c, 8) * f, 100.0) for f in (0.95, 1.0, 1.05)] for c in (4, 8, 16)}
    before = {c: SERIAL[c] for c in (4, 8, 16)}
    root = tmp_path / "confirm"
    servelab_tree(root, {"max-num-seqs-1": before, "max-num-seqs-1.max-num-seqs-8": after})
    analysis = Experiment.from_dict(plan.config).analysis
    res = analyze(root, tmp_path / "out", analysis, figures=False)
    conf = read_json(tmp_path / "out" / "confirmation.json")
    jsonschema.Draft202012Validator(load_schema("confirmation")).validate(conf)
    assert conf["proposals"][0]["verdict"] == res.confirmation["proposals"][0]["verdict"]
    (p,) = conf["proposals"]
    assert p["verdict"] == "confirmed"
    assert [e["concurrency"] for e in p["effects"]] == [4, 8, 16]
    e4 = p["effects"][0]
    assert e4["n"] == 3 and e4["throughput_ratio"] == pytest.approx(480 / 121, rel=0.02)
    lo, hi = e4["ratio_ci95"]
    assert lo < e4["throughput_ratio"] < hi
    assert e4["before"]["output_throughput"] == pytest.approx(121.0)
    assert conf["not_tried"] == plan.not_tried
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Confirmation" in report and "**P1 confirmed**" in report
    # the same data with the proposal doing nothing: refuted
    flat = tmp_path / "flat"
    servelab_tree(flat, {"max-num-seqs-1": before, "max-num-seqs-1.max-num-seqs-8": before})
    res = analyze(flat, tmp_path / "out2", analysis, figures=False)
    assert res.confirmation["proposals"][0]["verdict"] == "refuted"
