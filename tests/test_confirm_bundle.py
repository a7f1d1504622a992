"""A confirmation's bundle: provenance.json names the diagnosing bundle and which diagnosis led
to which change; `servelab verify` checks the diagnosing bundle with it (docs/bundle.md)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import KNEE_SPEC, servelab_tree
from bundle_fixtures import experiment

from servelab import config as cfgmod
from servelab.analysis.pipeline import analyze
from servelab.errors import ServelabError
from servelab.evidence.bundle import _finish, build_bundle
from servelab.evidence.files import write_deterministic_tar
from servelab.evidence.schemas import validate_file
from servelab.evidence.verify import verification, verify
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import read_json, write_json

REPO = Path(__file__).resolve().parents[1]
PROPOSED = "a100.max-num-seqs-16"  # the fixture's configuration ("a100") with the change
CLAIM = f"throughput[config={PROPOSED},c=128] > 1.2 * throughput[config=a100,c=128]"
PROPOSAL = {
    "id": "P1",
    "diagnoses": ["serialized", "kv_headroom_unused"],
    "server_config": "a100",
    "config": PROPOSED,
    "change": {"max-num-seqs": 16},
    "concurrency": [128],
    "claims": [CLAIM],
    "expected": "throughput at concurrency 128 rises",
    "why": "the server runs fewer sequences at once than the KV cache holds",
}
NOT_TRIED = {
    "diagnoses": ["past_knee"],
    "server_config": "a100",
    "proposal": "operate at concurrency 128",
    "reason": "an operating point, not a server change: nothing to measure",
}


def confirmation_bundle(tmp: Path, diagnosing: Path, out: Path) -> Path:
    """The bundle of a confirmation of the experiment whose bundle is `diagnosing`, at `out`:
    the fixture's experiment with the proposed configuration measured beside the diagnosed
    one, and analysis.confirms recording `diagnosing` and its manifest.json sha256."""
    paths, base = experiment(tmp, analysed=False)  # analysed below, with the proposed config
    cap = read_json(paths.capacity("a100"))
    servelab_tree(paths.root, {PROPOSED: KNEE_SPEC}, {PROPOSED: {**cap, "server_config": PROPOSED}})
    raw = base.to_dict()
    raw["experiment"] = "fixture-confirm"
    raw["server"]["configs"] = [
        {"name": "a100", "args": {"max-num-seqs": 8}},
        {"name": PROPOSED, "args": {"max-num-seqs": 16}},
    ]
    raw["analysis"]["claims"] = [CLAIM]
    raw["analysis"]["confirms"] = {
        "experiment": "fixture",
        "bundle": str(diagnosing),
        "manifest_sha256": sha256_file(diagnosing / "manifest.json"),
        "proposals": [PROPOSAL],
        "not_tried": [NOT_TRIED],
    }
    exp = cfgmod.validate(raw)
    assert not paths.analysis.exists()
    analyze(paths.root, paths.analysis, exp.analysis)
    build_bundle(exp, paths, out, REPO)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """results/fixture/bundle and results/fixture-confirm/bundle, built once."""
    tmp = tmp_path_factory.mktemp("built")
    paths, exp = experiment(tmp / "diagnosing")
    build_bundle(exp, paths, tmp / "results" / "fixture" / "bundle", REPO)
    confirmation_bundle(
        tmp / "confirmation",
        tmp / "results" / "fixture" / "bundle",
        tmp / "results" / "fixture-confirm" / "bundle",
    )
    return tmp / "results"


@pytest.fixture
def results(built: Path, tmp_path: Path) -> Path:
    """A copy of its own for every test: some tests tamper with it."""
    return Path(shutil.copytree(built, tmp_path / "results"))


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def recorded(confirmation: Path, manifest_sha256: str) -> None:
    """Make the confirmation bundle record another diagnosing manifest, consistently (as if
    it had been derived from that one)."""
    prov = read_json(confirmation / "provenance.json")
    prov["confirms"]["manifest_sha256"] = manifest_sha256
    write_json(confirmation / "provenance.json", prov)
    (confirmation / "manifest.json").unlink()
    (confirmation / "SHA256SUMS").unlink()
    _finish(confirmation, "fixture-confirm")


def test_provenance_says_which_diagnosis_led_to_which_change(built: Path) -> None:
    diagnosing = built / "fixture" / "bundle"
    prov_path = built / "fixture-confirm" / "bundle" / "provenance.json"
    prov = read_json(prov_path)
    assert prov["confirms"] == {
        "experiment": "fixture",
        "bundle": str(diagnosing),
        "manifest_sha256": sha256_file(diagnosing / "manifest.json"),
        "changes": [
            {
                "id": "P1",
                "diagnoses": ["serialized", "kv_headroom_unused"],
                "server_config": "a100",
                "config": PROPOSED,
                "change": {"max-num-seqs": 16},
            }
        ],
        "not_tried": [NOT_TRIED],
    }
    assert prov["config"]["analysis"]["confirms"]["proposals"] == [PROPOSAL]
    validate_file(prov_path, "provenance", "provenance.json")


@pytest.mark.parametrize(
    ("damage", "where"),
    [
        (lambda c: c.update(manifest_sha256="abc"), r"\$\.confirms\.manifest_sha256"),
        (lambda c: c["changes"][0].pop("change"), r"\$\.confirms\.changes\[0\]"),
        (lambda c: c.pop("not_tried"), r"\$\.confirms: 'not_tried' is a required property"),
    ],
)
def test_the_schema_holds_confirms_to_its_shape(
    results: Path, tmp_path: Path, damage: Any, where: str
) -> None:
    prov = read_json(results / "fixture-confirm" / "bundle" / "provenance.json")
    bad = copy.deepcopy(prov)
    damage(bad["confirms"])
    write_json(tmp_path / "provenance.json", bad)
    with pytest.raises(ServelabError, match=where):
        validate_file(tmp_path / "provenance.json", "provenance", "provenance.json")


def test_a_bundle_without_confirms_has_none(results: Path) -> None:
    prov = read_json(results / "fixture" / "bundle" / "provenance.json")
    assert "confirms" not in prov and "confirms" not in prov["config"]["analysis"]
    checked = verification(results / "fixture" / "bundle")
    assert checked.failures == [] and checked.diagnosing is None


def test_a_confirmation_holds_with_its_diagnosing_bundle(results: Path) -> None:
    checked = verification(results / "fixture-confirm" / "bundle", do_rebuild=True)
    assert checked.failures == []
    assert checked.diagnosing == results / "fixture" / "bundle"
    assert checked.manifest_sha256 == sha256_file(results / "fixture" / "bundle" / "manifest.json")


def test_a_tampered_diagnosing_manifest_is_named(results: Path) -> None:
    diagnosing = results / "fixture" / "bundle"
    flip(diagnosing / "manifest.json")
    (failure,) = verify(results / "fixture-confirm" / "bundle")
    assert failure.startswith(f"{diagnosing}/manifest.json: sha256 ")
    assert "this confirmation recorded" in failure


def test_a_diagnosing_bundle_that_does_not_hold_is_named_with_its_path(results: Path) -> None:
    diagnosing = results / "fixture" / "bundle"
    flip(diagnosing / "tables" / "knee.json")
    failures = verify(results / "fixture-confirm" / "bundle")
    assert f"{diagnosing}: tables/knee.json: sha256 differs from SHA256SUMS" in failures
    assert all(f.startswith(f"{diagnosing}: ") for f in failures), failures


def test_a_missing_diagnosing_bundle_is_named(results: Path) -> None:
    shutil.rmtree(results / "fixture")
    assert verify(results / "fixture-confirm" / "bundle") == [
        f"{results / 'fixture' / 'bundle'}: the diagnosing bundle of this confirmation is not "
        "there; pass --diagnosing DIR"
    ]


def test_diagnosing_names_the_bundle_elsewhere(results: Path, tmp_path: Path) -> None:
    moved = shutil.move(results / "fixture" / "bundle", tmp_path / "elsewhere")
    confirmation = results / "fixture-confirm" / "bundle"
    assert verify(confirmation) != []
    checked = verification(confirmation, diagnosing=Path(moved))
    assert checked.failures == [] and checked.diagnosing == Path(moved)
    with pytest.raises(ServelabError, match="not a confirmation's bundle"):
        verify(Path(moved), diagnosing=confirmation)


def test_a_confirmation_tarball_needs_diagnosing(results: Path, tmp_path: Path) -> None:
    """An extracted tarball has nothing beside it: the failure says to pass --diagnosing; the
    diagnosing bundle may be a folder or a tarball itself."""
    tarball = tmp_path / "fixture-confirm.tar.gz"
    write_deterministic_tar(results / "fixture-confirm" / "bundle", tarball, "fixture-confirm")
    (failure,) = verify(tarball)
    assert failure.startswith(f"{tarball}: a confirmation's tarball has no diagnosing bundle")
    assert "pass --diagnosing DIR (the bundle of fixture)" in failure
    assert verify(tarball, diagnosing=results / "fixture" / "bundle") == []
    theirs = tmp_path / "fixture.tar.gz"
    write_deterministic_tar(results / "fixture" / "bundle", theirs, "fixture")
    assert verify(tarball, diagnosing=theirs) == []


def test_rebuild_applies_to_the_diagnosing_bundle(results: Path) -> None:
    """A diagnosing bundle forged consistently (table, manifest and checksums rewritten) before
    the confirmation recorded it passes the checksums; --rebuild re-renders its tables too."""
    diagnosing = results / "fixture" / "bundle"
    table = diagnosing / "tables" / "summary.csv"
    table.write_text(table.read_text().replace("4996.33", "5996.33"))
    (diagnosing / "manifest.json").unlink()
    (diagnosing / "SHA256SUMS").unlink()
    _finish(diagnosing, "fixture")
    confirmation = results / "fixture-confirm" / "bundle"
    recorded(confirmation, sha256_file(diagnosing / "manifest.json"))
    assert verify(confirmation) == []
    assert verify(confirmation, do_rebuild=True) == [
        f"{diagnosing}: tables/summary.csv: differs when rebuilt from raw data"
    ]


def test_cli_verify_says_what_it_checked(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servelab.cli import main

    confirmation = results / "fixture-confirm" / "bundle"
    diagnosing = results / "fixture" / "bundle"
    sha = sha256_file(diagnosing / "manifest.json")
    assert main(["verify", str(confirmation)]) == 0
    out = capsys.readouterr().out
    assert f"diagnosing bundle {diagnosing}: holds (manifest sha256 {sha[:8]}...)" in out
    assert f"{confirmation}: OK (checksums, manifest, schemas)" in out
    assert main(["verify", str(diagnosing)]) == 0
    assert "diagnosing bundle" not in capsys.readouterr().out
    moved = shutil.move(diagnosing, tmp_path / "elsewhere")
    assert main(["verify", str(confirmation)]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["verify", str(confirmation), "--diagnosing", str(moved)]) == 0
    assert f"diagnosing bundle {moved}: holds" in capsys.readouterr().out
    assert main(["verify", str(moved), "--diagnosing", str(confirmation)]) == 2
