"""Campaign files (servelab.campaign): checked before anything runs, and the campaign table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow_env import snakemake_env

from servelab.campaign import campaign_rows, load_campaign, write_campaign
from servelab.errors import ServelabError

REPO = Path(__file__).resolve().parents[1]


def _experiment(tmp: Path, name: str, results: str = "results") -> str:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update(experiment=name, results_dir=results)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _campaign(tmp: Path, **data: object) -> Path:
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_campaign_loads() -> None:
    c = load_campaign(REPO / "config" / "campaigns" / "cpu.yaml", base=REPO)
    assert c.name == "cpu"
    assert [e.experiment for e in c.experiments] == ["quickstart-cpu", "max-num-seqs-sweep"]
    assert c.out_dir == Path("results/campaigns/cpu")


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        ({"name": "x", "experiments": [], "extra": 1}, "unknown key 'extra'"),
        ({"name": "has space", "experiments": ["a.yaml"]}, "name: 'has space' is not a name"),
        ({"name": "x", "experiments": []}, "experiments: list the experiment files"),
        ({"name": "x", "experiments": ["nope.yaml"]}, "experiments[0]: nope.yaml: file not found"),
    ],
)
def test_bad_campaign_files_name_the_key(tmp_path: Path, data: dict, expect: str) -> None:
    with pytest.raises(ServelabError) as exc:
        load_campaign(_campaign(tmp_path, **data), base=tmp_path)
    assert str(exc.value).startswith(str(tmp_path / "campaign.yaml") + ": ")
    assert expect in str(exc.value)


def test_two_experiments_writing_one_folder_are_refused(tmp_path: Path) -> None:
    a = _experiment(tmp_path, "same")
    (tmp_path / "b").mkdir()
    b = _experiment(tmp_path / "b", "same")
    with pytest.raises(ServelabError, match="writes to results/same, as .* does"):
        load_campaign(_campaign(tmp_path, name="x", experiments=[a, b]))


def test_an_invalid_experiment_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["sweep"]["repeats"] = "three"
    bad.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ServelabError, match="bad.yaml: sweep.repeats"):
        load_campaign(_campaign(tmp_path, name="x", experiments=[str(bad)]))


def _fake_experiment(root: Path, host: str | None) -> Path:
    """An experiment folder with the two files the campaign table reads."""
    (root / "analysis").mkdir(parents=True)
    (root / "analysis" / "summary.csv").write_text(
        "server_config,concurrency,metric,n,mean,sd,cv_pct,ci95_low,ci95_high,min,max\n"
        "mns8,8,output_throughput,3,412.5,10,2.4,390,435,400,420\n"
        "mns8,8,request_throughput,3,6.4,0.1,1.5,6.2,6.6,6.3,6.5\n"
        "mns8,8,mean_ttft_ms,0,,,,,,,\n"
    )
    if host is not None:
        launch = root / "server" / "mns8" / "launch.json"
        launch.parent.mkdir(parents=True)
        launch.write_text(json.dumps({"node": {"hostname": host}}))
    return root


def test_campaign_table_has_experiment_host_and_only_its_metrics(tmp_path: Path) -> None:
    a = _fake_experiment(tmp_path / "a", "node1")
    b = _fake_experiment(tmp_path / "b", None)  # recorded before nodes were
    rows = campaign_rows([("b-exp", b), ("a-exp", a)])
    assert [(r["experiment"], r["metric"]) for r in rows] == [
        ("a-exp", "output_throughput"),
        ("a-exp", "mean_ttft_ms"),
        ("b-exp", "output_throughput"),
        ("b-exp", "mean_ttft_ms"),
    ]
    assert rows[0]["host"] == "node1" and rows[2]["host"] == ""
    assert rows[0]["mean"] == 412.5 and rows[1]["mean"] is None and rows[1]["n"] == 0
    md = write_campaign("pair", [("a-exp", a), ("b-exp", b)], tmp_path / "out").read_text()
    assert "| a-exp | mns8 | 8 | 412.5 | - | - | - | node1 |" in md
    assert "| b-exp | mns8 | 8 | 412.5 | - | - | - | not recorded |" in md
    first = (tmp_path / "out" / "campaign.csv").read_bytes()
    write_campaign("pair", [("a-exp", a), ("b-exp", b)], tmp_path / "out")
    assert (tmp_path / "out" / "campaign.csv").read_bytes() == first


def test_campaign_table_needs_each_analysis(tmp_path: Path) -> None:
    with pytest.raises(ServelabError, match="summary.csv: not found; run the experiment x first"):
        campaign_rows([("x", tmp_path)])


def _dry_run(campaign: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["snakemake", "-n", "--config", f"campaign={campaign}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=snakemake_env(),
        timeout=300,
    )


def test_campaign_workflow_names_each_experiments_rules(tmp_path: Path) -> None:
    """One invocation, every experiment: its rules prefixed, the campaign table last."""
    a = _experiment(tmp_path, "exp-a", str(tmp_path / "results"))
    b = _experiment(tmp_path, "exp-b", str(tmp_path / "results"))
    proc = _dry_run(_campaign(tmp_path, name="pair", experiments=[a, b]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "campaign pair: 2 experiment(s): exp-a, exp-b" in out
    for rule in ("exp_exp_a_sweep", "exp_exp_b_sweep", "exp_exp_a_bundle", "campaign"):
        assert rule in out
    # the measuring rules take the measurement slot, the runtime's too: in a campaign one
    # experiment's runtime is never built beside another's sweep (docs/architecture.md)
    measuring = _resources_by_rule(out)
    for exp in ("exp_a", "exp_b"):
        for rule in ("runtime", "sweep_profile"):
            assert "measure=1" in measuring[f"exp_{exp}_{rule}"], (rule, measuring)
        assert "measure=1" not in measuring[f"exp_{exp}_analysis"]
    proc = _dry_run(_campaign(tmp_path, name="pair", experiments=[a, a]))
    assert proc.returncode != 0 and "campaign error:" in proc.stderr


def _resources_by_rule(dry_run: str) -> dict[str, str]:
    """Each rule of a dry run's job list with its `resources:` line (the last job of a rule)."""
    out: dict[str, str] = {}
    rule = None
    for line in dry_run.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("rule", "localrule") and words[1].endswith(":"):
            rule = words[1][:-1]
        elif rule is not None and words[:1] == ["resources:"]:
            out[rule] = line
            rule = None
    return out
