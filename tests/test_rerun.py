"""`servelab rerun` (servelab.reproduce.rerun): the experiment that measures a reference's server
beside the current side on this host, derived from bundles; what a bundle must carry for it,
and the one-line refusals where it does not."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from bundle_fixtures import LOCK_SHA, experiment

from servelab import config as cfgmod
from servelab.cli import main
from servelab.errors import ServelabError
from servelab.evidence.bundle import build_bundle
from servelab.reproduce.rerun import RerunOptions, rerun_config
from servelab.reproduce.sides import open_side
from servelab.store.hashing import sha256_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture experiment bundled twice: as run (--max-num-seqs 8 on every configuration),
    and as a later release that changed it to 2."""
    tmp = tmp_path_factory.mktemp("rerun")
    paths, exp = experiment(tmp / "made")
    build_bundle(exp, paths, tmp / "ref", REPO)
    changed = cfgmod.validate(
        {**exp.to_dict(), "server": {"configs": [{"name": "a100", "args": {"max-num-seqs": 2}}]}}
    )
    build_bundle(changed, paths, tmp / "cur", REPO)
    return {"ref": tmp / "ref", "cur": tmp / "cur"}


def derive(tmp: Path, ref: Path, cur: Path | None = None, **opts: Any) -> dict[str, Any]:
    reference = open_side(ref, tmp / "w1")
    current = open_side(cur, tmp / "w2", "current side") if cur is not None else None
    this = cfgmod.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    return rerun_config(reference, current, this, tmp / "out", REPO, RerunOptions(**opts))


def test_a_bundle_carries_the_bytes_of_its_lock(bundles: dict[str, Path]) -> None:
    lock = bundles["ref"] / "runtime" / "vllm-cpu.lock"
    assert sha256_file(lock) == LOCK_SHA == sha256_file(REPO / "envs" / "vllm-cpu.lock")
    assert "runtime/vllm-cpu.lock" in (bundles["ref"] / "SHA256SUMS").read_text()


def test_two_releases_are_measured_side_by_side_interleaved(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    cfg = derive(tmp_path, bundles["ref"], bundles["cur"], margin_pct=15.0, rounds=(3, 5))
    exp = cfgmod.validate(cfg)  # the derived config is a valid experiment
    assert exp.name == "rerun-fixture"
    assert [(c.name, dict(c.args)) for c in exp.server.configs] == [
        ("reference-a100", {}),
        ("current-a100", {"max-num-seqs": 2}),
    ]
    assert [(p.a, p.b) for p in exp.analysis.compare] == [("reference-a100", "current-a100")]
    assert exp.analysis.margin_pct == 15.0 and exp.analysis.claims == ()
    assert exp.sweep.rounds is not None and exp.sweep.rounds.interleave is True
    assert (exp.sweep.rounds.min, exp.sweep.rounds.max) == (3, 5)
    assert exp.sweep.concurrency == (64, 128, 256) and not exp.profile.enabled
    # one lock for both sides: no runtime of its own; the lock of envs/ with that sha256, whose
    # venv the other runs made
    assert all(c.runtime is None for c in exp.server.configs)
    assert exp.runtime.lock == "envs/vllm-cpu.lock"
    assert exp.workload.waves == 4 * 4  # each point 4 times the reference's
    # side by side (where it runs, the fixture's memory decides), each point in slices of 2
    # waves; one at a time, whole points
    plan = exp.sweep.rounds
    assert plan.slices == (8 if plan.side_by_side else 1)
    one = derive(tmp_path / "one", bundles["ref"], bundles["cur"], side_by_side=False)
    assert one["sweep"]["repeats"]["slices"] == 1
    both = derive(tmp_path / "two", bundles["ref"], bundles["cur"], side_by_side=True, slices=3)
    assert both["sweep"]["repeats"]["slices"] == 3 and cfgmod.validate(both)


def test_a_lock_only_the_bundle_carries_is_written_under_its_own_name(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"  # a checkout whose envs/ lacks the lock
    (repo / "envs").mkdir(parents=True)
    reference = open_side(bundles["ref"], tmp_path / "w1")
    current = open_side(bundles["cur"], tmp_path / "w2")
    this = cfgmod.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    cfg = rerun_config(reference, current, this, tmp_path / "out", repo, RerunOptions(waves=6))
    lock = Path(cfg["runtime"]["lock"])
    assert lock == tmp_path / "out" / "locks" / LOCK_SHA[:16] / "vllm-cpu.lock"
    assert sha256_file(lock) == LOCK_SHA and cfg["workload"]["waves"] == 6


def test_without_a_current_side_it_is_this_checkouts_runtime(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    cfg = derive(tmp_path, bundles["ref"])
    names = [c["name"] for c in cfg["server"]["configs"]]
    assert names == ["reference-a100", "current-a100"]
    assert cfg["server"]["configs"][1]["args"] == cfg["server"]["configs"][0]["args"]


def test_a_bundle_without_its_lock_is_refused_naming_it(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    old = Path(shutil.copytree(bundles["ref"], tmp_path / "old"))
    (old / "runtime" / "vllm-cpu.lock").unlink()
    from servelab.reproduce.rerun import lock_bytes
    from servelab.reproduce.sides import bundle_side

    side = bundle_side(str(old), "bundle", old, None)  # not verified: a file was removed
    # still re-runs where a lock of envs/ has the recorded sha256 (the committed releases)
    data, where = lock_bytes(side, None, REPO)
    assert where == "envs/vllm-cpu.lock" and data
    repo = tmp_path / "repo"  # a checkout whose envs/ lacks it
    (repo / "envs").mkdir(parents=True)
    with pytest.raises(ServelabError, match=r"does not carry the bytes of its lock vllm-cpu.lock"):
        lock_bytes(side, None, repo)


def test_what_a_rerun_cannot_do_is_refused_in_one_line(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ServelabError, match=r"--config b200: not a server configuration"):
        derive(tmp_path, bundles["ref"], configs=("b200",))
    other = Path(shutil.copytree(bundles["cur"], tmp_path / "other"))
    cfg = yaml.safe_load((other / "config.resolved.yaml").read_text())
    cfg["model"]["tiny"]["layers"] = 8
    (other / "config.resolved.yaml").write_text(yaml.safe_dump(cfg))
    from servelab.reproduce.sides import bundle_side

    reference = open_side(bundles["ref"], tmp_path / "w")
    current = bundle_side(str(other), "bundle", other, None)
    this = cfgmod.resolve(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    with pytest.raises(ServelabError, match=r"serves another model .* \(model.tiny differs\)"):
        rerun_config(reference, current, this, tmp_path / "out", REPO)
    endpoint = {**this, "runtime": {**this["runtime"], "kind": "endpoint"}}
    with pytest.raises(ServelabError, match=r"runtime.kind endpoint\); give the current side"):
        rerun_config(reference, None, endpoint, tmp_path / "out", REPO)


def test_the_command_writes_the_experiment_of_a_committed_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed v8 predates lock bytes in bundles: its lock is found in envs/ by its
    sha256. --write-only measures nothing and prints the command that would."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "results"
    argv = ["rerun", "evidence/quickstart-cpu/v8", "--results-dir", str(out), "--write-only"]
    assert main([*argv, "--rounds", "3:4", "--config", "max-num-seqs-8"]) == 0
    said = capsys.readouterr().out
    path = out / "rerun-quickstart-cpu" / "rerun.yaml"
    assert f"snakemake --cores all --configfile {path}" in said
    text = path.read_text()
    assert text.startswith("# Written by `servelab rerun`")
    assert "# reference: evidence/quickstart-cpu/v8 (release v8)" in text
    exp = cfgmod.load(path)
    assert [c.name for c in exp.server.configs] == [
        "reference-max-num-seqs-8",
        "current-max-num-seqs-8",
    ]
    assert main([*argv, "--rounds", "1:4"]) == 2
    assert "--rounds 1:4: give MIN:MAX with 2 <= MIN <= MAX" in capsys.readouterr().err
