"""Server configurations measured on different nodes: launch.json records the node, the
analysis names the hosts beside every comparison across them, and one whose hosts differ in a
performance-relevant fact is `not comparable`. Raw data measured on one node, or without the
node recorded, analyses byte for byte as before."""

from __future__ import annotations

import copy
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from servelab.analysis.claims import VERDICTS
from servelab.analysis.pipeline import analysis_section, analyze, load_dataset
from servelab.analysis.result import Analysis
from servelab.evidence.files import safe_extract
from servelab.experiment import AnalysisSection
from servelab.hostfacts import node_facts
from servelab.reproduce.checks import NOT_COMPARABLE, analyse, claim_rows
from servelab.store.jsonio import load_schema
from servelab.store.rawdata import DamagedRawData

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "evidence" / "quickstart-cpu" / "v9"
CONFIGS = ("max-num-seqs-1", "max-num-seqs-8")
# the release's claims: two compare the two configs, two read one config
SERIALIZED = "serialized(config=max-num-seqs-1)"
ACROSS_TPUT = (
    "throughput[config=max-num-seqs-8,c=16] > 1.5 * throughput[config=max-num-seqs-1,c=16]"
)
WITHIN = "throughput[config=max-num-seqs-8,c=8] > throughput[config=max-num-seqs-8,c=2]"
ACROSS_TTFT = (
    "mean_ttft_ms[config=max-num-seqs-1,c=4] > 2 * mean_ttft_ms[config=max-num-seqs-8,c=4]"
)
ACROSS = (ACROSS_TPUT, ACROSS_TTFT)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return safe_extract(RELEASE / "v9.tar.gz", tmp_path_factory.mktemp("v9"))


@pytest.fixture(scope="module")
def opts(release: Path) -> AnalysisSection:
    cfg = yaml.safe_load((release / "config.resolved.yaml").read_text(encoding="utf-8"))
    return analysis_section(cfg["analysis"])


@pytest.fixture(scope="module")
def host(release: Path) -> dict[str, Any]:
    """The measuring host of the release, as host_facts() records it."""
    return dict(json.loads((release / "provenance.json").read_text(encoding="utf-8"))["host"])


def experiment(release: Path, tmp: Path, nodes: dict[str, dict[str, Any]] | None = None) -> Path:
    """The release's raw data in a folder of its own, with `nodes` (config -> node) written
    into each launch.json."""
    exp = tmp / "exp"
    for sub in ("raw", "server", "runtime"):
        shutil.copytree(release / sub, exp / sub)
    for sc, node in (nodes or {}).items():
        lj = exp / "server" / sc / "launch.json"
        launch = json.loads(lj.read_text(encoding="utf-8"))
        launch["node"] = node
        lj.write_text(json.dumps(launch), encoding="utf-8")
    return exp


def node(host: dict[str, Any], hostname: str, **flags: bool) -> dict[str, Any]:
    h = copy.deepcopy(host)
    h["cpu_facts"]["flags"].update(flags)
    return {"hostname": hostname, "slurm_job_id": "4242", "host": h}


def outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))}


def run(exp: Path, opts: AnalysisSection, out: Path) -> tuple[Analysis, dict[str, Any]]:
    results = analyze(exp, out, opts, figures=False)
    claims = {c["claim"]: c for c in json.loads((out / "claims.json").read_text())}
    jsonschema.validate(list(claims.values()), load_schema("claims"))
    return results, claims


@pytest.fixture(scope="module")
def plain(release: Path, opts: AnalysisSection, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analysis of the release's raw data as it is (no node recorded)."""
    tmp = tmp_path_factory.mktemp("plain")
    analyze(experiment(release, tmp), tmp / "out", opts, figures=False)
    return tmp / "out"


def test_one_node_leaves_every_output_byte_for_byte(
    release: Path, opts: AnalysisSection, host: dict[str, Any], plain: Path, tmp_path: Path
) -> None:
    same = node(host, "vm1")
    exp = experiment(release, tmp_path, {sc: same for sc in CONFIGS})
    assert set(load_dataset(exp).nodes) == set(CONFIGS)
    results, _ = run(exp, opts, tmp_path / "out")
    assert results.hosts_differ is None
    assert outputs(tmp_path / "out") == outputs(plain)
    for table in sorted((release / "tables").iterdir()):  # the released tables themselves
        assert (plain / table.name).read_bytes() == table.read_bytes(), table.name


@pytest.mark.parametrize(
    ("change", "cls"),
    [(lambda h: None, "identical"), (lambda h: h.update(kernel="6.1.0-other"), "equivalent")],
)
def test_two_hosts_alike_keep_the_verdicts_and_name_the_hosts(
    release: Path,
    opts: AnalysisSection,
    host: dict[str, Any],
    plain: Path,
    tmp_path: Path,
    change: Any,
    cls: str,
) -> None:
    second = node(host, "vm2")
    change(second["host"])
    exp = experiment(
        release, tmp_path, {"max-num-seqs-1": node(host, "vm1"), "max-num-seqs-8": second}
    )
    results, claims = run(exp, opts, tmp_path / "out")
    before = {c["claim"]: c for c in json.loads((plain / "claims.json").read_text())}
    assert {k: c["verdict"] for k, c in claims.items()} == {
        k: c["verdict"] for k, c in before.items()
    }
    assert all(c["verdict"] == "holds" for c in claims.values())
    for claim in ACROSS:
        a, b = ("vm2", "vm1") if claim == ACROSS_TPUT else ("vm1", "vm2")
        want = ["kernel"] if cls == "equivalent" else []
        assert claims[claim]["hosts"] == {"a": a, "b": b, "class": cls, "differences": want}
    assert "hosts" not in claims[SERIALIZED] and "hosts" not in claims[WITHIN]
    assert results.hosts_differ == {"max-num-seqs-1": "vm1", "max-num-seqs-8": "vm2"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "- Server configurations were measured on different hosts: max-num-seqs-1 on vm1, "
        "max-num-seqs-8 on vm2." in report
    )
    assert f"holds; measured on different hosts: vm1, vm2 ({cls})" in report
    assert f"holds; measured on different hosts: vm2, vm1 ({cls})" in report
    # the tables that do not carry verdicts are those of the release
    for table in ("points.csv", "summary.csv", "paired.csv", "knee.json", "diagnoses.json"):
        assert (tmp_path / "out" / table).read_bytes() == (plain / table).read_bytes()


def test_hosts_that_differ_make_the_comparisons_across_them_not_comparable(
    release: Path, opts: AnalysisSection, host: dict[str, Any], plain: Path, tmp_path: Path
) -> None:
    nodes = {
        "max-num-seqs-1": node(host, "vm1"),
        "max-num-seqs-8": node(host, "vm2", avx512f=False),
    }
    exp = experiment(release, tmp_path, nodes)
    _, claims = run(exp, opts, tmp_path / "out")
    for claim in ACROSS:
        c = claims[claim]
        a, b = ("vm2", "vm1") if claim == ACROSS_TPUT else ("vm1", "vm2")
        assert c["verdict"] == "not comparable"
        assert c["reason"] == (
            f"not comparable: measured on different hosts: {a}, {b}, which differ in: avx512f"
        )
        assert c["hosts"] == {"a": a, "b": b, "class": "differs", "differences": ["avx512f"]}
        assert c["evidence"]["test_verdict"] == "a > b"  # the test itself is kept
    for claim in (SERIALIZED, WITHIN):  # one config each: one node
        assert claims[claim]["verdict"] == "holds" and "hosts" not in claims[claim]
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "| not comparable: measured on different hosts: vm1, vm2, which differ in: avx512f |"
        in (report)
    )
    # a reproduction of such a claim is not comparable, and says why
    ref = analyse(load_dataset(exp), opts)
    new = analyse(load_dataset(experiment(release, tmp_path / "fresh")), opts)
    rows = {r["claim"]: r for r in claim_rows(ref, new, opts, list(opts.claims))}
    assert rows[ACROSS_TTFT]["verdict"] == NOT_COMPARABLE
    assert rows[ACROSS_TTFT]["reason"] == (
        "not comparable in the reference: measured on different hosts: vm1, vm2, which differ "
        "in: avx512f"
    )
    assert rows[WITHIN]["verdict"] == "REPRODUCED"


def test_one_hostname_with_other_facts_is_two_hosts(
    release: Path, opts: AnalysisSection, host: dict[str, Any], tmp_path: Path
) -> None:
    """A name reused by another machine: the facts decide, not the name."""
    nodes = {"max-num-seqs-1": node(host, "vm1"), "max-num-seqs-8": node(host, "vm1", avx2=False)}
    _, claims = run(experiment(release, tmp_path, nodes), opts, tmp_path / "out")
    assert claims[ACROSS_TTFT]["verdict"] == "not comparable"
    assert claims[ACROSS_TTFT]["hosts"]["differences"] == ["avx2"]
    assert claims[ACROSS_TTFT]["reason"] == (
        "not comparable: measured on different hosts: two named vm1, which differ in: avx2"
    )


def test_a_damaged_node_is_named(release: Path, host: dict[str, Any], tmp_path: Path) -> None:
    nodes: dict[str, Any] = {"max-num-seqs-1": node(host, "vm1"), "max-num-seqs-8": "vm2"}
    exp = experiment(release, tmp_path, nodes)
    with pytest.raises(DamagedRawData) as err:
        load_dataset(exp)
    assert "max-num-seqs-8/launch.json" in str(err.value) and "$.node" in str(err.value)
    ds = load_dataset(exp, skip_damaged=True)
    assert set(ds.nodes) <= {"max-num-seqs-1"}


def test_every_verdict_is_in_the_schema() -> None:
    verdict = load_schema("claims")["items"]["properties"]["verdict"]
    assert tuple(verdict["enum"]) == VERDICTS


def test_node_facts_name_the_node_and_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SERVELAB_TEST_SECRET_TOKEN", "tok-123-secret")
    rec = node_facts()
    assert rec["hostname"] == platform.node() and rec["slurm_job_id"] == "123456"
    assert {"cpu", "cores", "memory_bytes", "os", "kernel", "cpu_facts", "gpus"} <= set(rec["host"])
    assert "tok-123-secret" not in json.dumps(rec)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert node_facts()["slurm_job_id"] is None
    launch = load_schema("launch")
    jsonschema.validate(rec, launch["properties"]["node"])


def test_the_sweep_records_its_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep against the fake server in a fake container (tests/test_runtime_container.py)."""
    from experiment_fixtures import measure_job
    from test_runtime_container import Engine, config, model_dir, runtime_stage

    from servelab.measure.sweep import run_sweep
    from servelab.store.jsonio import read_json

    Engine(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    cfg = config(tmp_path)
    runtime = runtime_stage(cfg, lambda s: None)
    exp = tmp_path / "results" / "fake-gpu"
    run_sweep(measure_job(cfg, exp, model_dir=model_dir(tmp_path), runtime=runtime), "fake")
    launch = read_json(exp / "server" / "fake" / "launch.json")
    assert launch["node"]["hostname"] == platform.node()
    assert launch["node"]["slurm_job_id"] == "777"
    assert launch["node"]["host"]["cpu_facts"] == launch["cpu_facts"]
    assert load_dataset(exp).nodes == {"fake": launch["node"]}
