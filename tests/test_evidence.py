"""The evidence bundle: checksums, manifest, schemas, determinism, tamper detection, release,
and safe extraction."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from bundle_fixtures import SECRET, experiment
from release_fixtures import CommittedRelease

from servelab.errors import ServelabError
from servelab.evidence.bundle import build_bundle
from servelab.evidence.files import safe_extract, write_deterministic_tar
from servelab.evidence.release import release
from servelab.evidence.verify import verify
from servelab.experiment import Experiment
from servelab.store.jsonio import write_json
from servelab.store.paths import ExperimentPaths

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built_experiment(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ExperimentPaths, Experiment]:
    """The fixture experiment, finished and analysed once (about 2 s): build_bundle only reads
    it."""
    return experiment(tmp_path_factory.mktemp("experiment"))


@pytest.fixture(scope="module")
def built_bundle(
    built_experiment: tuple[ExperimentPaths, Experiment], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The fixture experiment's bundle, built once (a second second per test otherwise)."""
    paths, exp = built_experiment
    out = tmp_path_factory.mktemp("built") / "bundle"
    build_bundle(exp, paths, out, REPO)
    return out


@pytest.fixture
def bundle(built_bundle: Path, tmp_path: Path) -> Path:
    """A copy of its own for every test: some tests tamper with it."""
    return Path(shutil.copytree(built_bundle, tmp_path / "bundle", symlinks=True))


def test_bundle_verifies_and_sha256sum_accepts_it(bundle: Path) -> None:
    assert verify(bundle, do_rebuild=True) == []
    proc = subprocess.run(
        ["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((bundle / "manifest.json").read_text())
    roles = {e["path"]: e["role"] for e in manifest["files"]}
    assert roles["raw/a100/rep01/c0128/requests.jsonl.gz"] == "raw"
    assert roles["figures/throughput_vs_concurrency.svg"] == "figure"
    assert roles["tables/paired.csv"] == "table"
    schemas = {e["path"]: e["schema"] for e in manifest["files"]}
    assert schemas["raw/a100/rep01/c0128/point.json"] == "https://servelab.dev/schemas/point/v1"
    assert schemas["provenance.json"] == "https://servelab.dev/schemas/provenance/v1"
    prov = json.loads((bundle / "provenance.json").read_text())
    assert (
        prov["model"]["revision"]
        == json.loads((bundle / "model" / "servelab-model.json").read_text())["revision"]
    )
    assert prov["host"]["cores"] >= 1 and prov["pipeline"]["servelab_version"]
    assert prov["vllm_version"] == "0.32.0"
    statement = json.loads((bundle / "attestation.intoto.json").read_text())
    names = {s["name"] for s in statement["subject"]}
    assert "report.md" in names and "provenance.json" in names
    crate = json.loads((bundle / "ro-crate-metadata.json").read_text())
    actions = [e for e in crate["@graph"] if e.get("@type") == "CreateAction"]
    assert {a["@id"] for a in actions} == {
        "#stage-model",
        "#stage-runtime",
        "#stage-sweep-a100",
        "#stage-analysis",
    }


def test_two_builds_are_byte_identical(
    built_experiment: tuple[ExperimentPaths, Experiment], tmp_path: Path
) -> None:
    paths, exp = built_experiment
    build_bundle(exp, paths, tmp_path / "one", REPO)
    build_bundle(exp, paths, tmp_path / "two", REPO)
    one = sorted(
        p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file()
    )
    two = sorted(
        p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*") if p.is_file()
    )
    assert one == two and len(one) > 40
    for rel in one:
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes(), rel


def test_secrets_never_reach_the_bundle(bundle: Path) -> None:
    for p in bundle.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p
    assert "<redacted>" in (bundle / "config.resolved.yaml").read_text()


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (
            lambda b: flip(b / "raw/a100/rep02/c0064/requests.jsonl.gz"),
            "raw/a100/rep02/c0064/requests.jsonl.gz: sha256 differs from SHA256SUMS",
        ),
        (
            lambda b: flip(b / "figures/latency_throughput.png"),
            "figures/latency_throughput.png: sha256 differs",
        ),
        (
            lambda b: (b / "manifest.json").write_text(
                (b / "manifest.json").read_text().replace('"role": "table"', '"role": "tabel"', 1)
            ),
            "manifest.json: sha256 differs from SHA256SUMS",
        ),
        (
            lambda b: (b / "tables/knee.json").unlink(),
            "tables/knee.json: listed in SHA256SUMS but missing",
        ),
        (
            lambda b: (b / "extra.txt").write_text("x"),
            "extra.txt: present but not listed in SHA256SUMS",
        ),
    ],
)
def test_tampering_is_named(bundle: Path, tamper: Any, expected: str) -> None:
    tamper(bundle)
    failures = verify(bundle)
    assert any(expected in f for f in failures), failures


def test_rebuild_catches_a_consistent_forgery(bundle: Path) -> None:
    """A table edited with checksums and manifest rewritten passes the checksums; --rebuild
    re-renders it from the raw data and names it."""
    from servelab.evidence.bundle import _finish

    table = bundle / "tables" / "summary.csv"
    table.write_text(table.read_text().replace("4996.33", "5996.33"))
    (bundle / "manifest.json").unlink()
    (bundle / "SHA256SUMS").unlink()
    _finish(bundle, "fixture")
    assert verify(bundle) == []
    assert verify(bundle, do_rebuild=True) == [
        "tables/summary.csv: differs when rebuilt from raw data"
    ]


def test_rebuild_of_a_bundle_made_by_another_analysis_version_says_so(bundle: Path) -> None:
    """Tables made by an older analysis cannot rebuild byte for byte: --rebuild names the
    version and the commit to rebuild with, instead of a list of differing files."""
    from servelab.analysis.pipeline import ANALYSIS_VERSION
    from servelab.evidence.bundle import _finish

    prov = json.loads((bundle / "provenance.json").read_text())
    assert prov["pipeline"]["analysis_version"] == ANALYSIS_VERSION
    del prov["pipeline"]["analysis_version"]  # as in bundles made before it was recorded
    (bundle / "provenance.json").write_text(json.dumps(prov))
    (bundle / "manifest.json").unlink()
    (bundle / "SHA256SUMS").unlink()
    _finish(bundle, "fixture")
    assert verify(bundle) == []
    (failure,) = verify(bundle, do_rebuild=True)
    assert f"made by analysis version 1, this servelab has version {ANALYSIS_VERSION}" in failure
    assert str(prov["pipeline"]["git_commit"]) in failure


def test_schema_failure_names_file_and_json_path(bundle: Path) -> None:
    from servelab.evidence.bundle import _finish

    cap = bundle / "server" / "a100" / "capacity.json"
    data = json.loads(cap.read_text())
    data["kv_cache_tokens"] = "lots"
    cap.write_text(json.dumps(data))
    (bundle / "manifest.json").unlink()
    with pytest.raises(
        ServelabError,
        match=r"server/a100/capacity.json: \$\.kv_cache_tokens: 'lots' is not of type",
    ):
        _finish(bundle, "fixture")


def test_release_refuses_dirty_tree_then_marks_it(bundle: Path, tmp_path: Path) -> None:
    prov = json.loads((bundle / "provenance.json").read_text())
    assert "git_dirty" in prov["pipeline"]
    # make the bundle's pipeline dirty, consistently re-described
    prov["pipeline"]["git_dirty"] = True
    prov["pipeline"]["git_commit"] = "0" * 40
    write_json(bundle / "provenance.json", prov)
    from servelab.evidence.bundle import _finish

    (bundle / "manifest.json").unlink()
    _finish(bundle, "fixture")
    with pytest.raises(ServelabError, match="uncommitted changes"):
        release(bundle, "v1", tmp_path / "evidence")
    assert not (tmp_path / "evidence" / "fixture" / "v1" / "release.json").exists()
    dest = release(bundle, "v1", tmp_path / "evidence", allow_unpinned=True)
    rel = json.loads((dest / "release.json").read_text())
    assert (
        rel["pinned"] is False and "the git tree has uncommitted changes" in rel["unpinned_reasons"]
    )
    with pytest.raises(ServelabError, match="exists; releases are immutable"):
        release(bundle, "v1", tmp_path / "evidence", allow_unpinned=True)
    # the tarball is deterministic and verifies
    dest2 = release(bundle, "v2", tmp_path / "evidence2", allow_unpinned=True)
    assert (dest / "v1.tar.gz").read_bytes() != b""
    with tarfile.open(dest / "v1.tar.gz") as t:
        infos = t.getmembers()
    assert all(i.mtime == 0 and i.uid == 0 and i.gid == 0 and i.uname == "" for i in infos)
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert (dest / "v1.tar.gz").read_bytes()[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0
    assert verify(dest / "v1.tar.gz", do_rebuild=True) == []
    assert (dest2 / "v2.tar.gz").stat().st_size > 0
    sha = (dest / "v1.tar.gz.sha256").read_text().split()[0]
    assert sha == rel["tarball_sha256"]


def test_same_bundle_same_tarball(bundle: Path, tmp_path: Path) -> None:
    a = write_deterministic_tar(bundle, tmp_path / "a.tar.gz", "x")
    b = write_deterministic_tar(bundle, tmp_path / "b.tar.gz", "x")
    assert a == b and (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()


def evil_tar(path: Path, kind: str) -> None:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("rel/ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        if kind == "traversal":
            m = tarfile.TarInfo("rel/../../escaped.txt")
            m.size = 4
            tar.addfile(m, io.BytesIO(b"evil"))
        elif kind == "absolute":
            m = tarfile.TarInfo("/tmp/servelab-absolute-escape.txt")
            m.size = 4
            tar.addfile(m, io.BytesIO(b"evil"))
        elif kind == "symlink":
            m = tarfile.TarInfo("rel/link")
            m.type = tarfile.SYMTYPE
            m.linkname = "/etc"
            tar.addfile(m)
        elif kind == "device":
            m = tarfile.TarInfo("rel/dev")
            m.type = tarfile.CHRTYPE
            m.devmajor, m.devminor = 1, 3
            tar.addfile(m)


@pytest.mark.parametrize("kind", ["traversal", "absolute", "symlink", "device"])
def test_malicious_tarballs_are_refused_without_writing(tmp_path: Path, kind: str) -> None:
    evil = tmp_path / "evil.tar.gz"
    evil_tar(evil, kind)
    target = tmp_path / "deep" / "target"
    with pytest.raises(ServelabError, match="refused"):
        safe_extract(evil, target)
    assert not target.exists()  # checked before anything is written
    assert (
        not (tmp_path / "escaped.txt").exists() and not (tmp_path / "deep" / "escaped.txt").exists()
    )
    assert not Path("/tmp/servelab-absolute-escape.txt").exists()
    failures_or_error: list[str] | None = None
    with pytest.raises(ServelabError):
        failures_or_error = verify(evil)
    assert failures_or_error is None


def test_cli_verify_exit_codes(bundle: Path) -> None:
    from servelab.cli import main

    assert main(["verify", str(bundle), "--rebuild"]) == 0
    flip(bundle / "report.md")
    assert main(["verify", str(bundle)]) == 1
    shutil.rmtree(bundle)
    assert main(["verify", str(bundle)]) == 2


def test_the_workflow_records_the_config_without_the_reference(
    built_experiment: tuple[ExperimentPaths, Experiment], tmp_path: Path
) -> None:
    """The workflow's bundle records the config its rule sees: `reference:` and
    `reproduction:` (how a run is judged, not what was run) are left out; `servelab bundle`
    records the config file as given."""
    import yaml

    paths, exp = built_experiment
    build_bundle(exp, paths, tmp_path / "cli", REPO)
    build_bundle(exp, paths, tmp_path / "wf", REPO, leave_out={"reference", "reproduction"})
    given = yaml.safe_load((tmp_path / "cli" / "config.resolved.yaml").read_text())
    recorded = yaml.safe_load((tmp_path / "wf" / "config.resolved.yaml").read_text())
    assert {"reference", "reproduction"} <= set(given)
    assert recorded == {k: v for k, v in given.items() if k not in ("reference", "reproduction")}
    prov = json.loads((tmp_path / "wf" / "provenance.json").read_text())
    assert prov["config"] == recorded


def releases_of_this_analysis() -> list[Path]:
    """The committed release folders whose tables this servelab's analysis version made."""
    from servelab.analysis.pipeline import ANALYSIS_VERSION

    out = []
    for rel in sorted((REPO / "evidence").glob("*/*/release.json")):
        prov = json.loads((rel.parent / "provenance.json").read_text(encoding="utf-8"))
        if prov["pipeline"].get("analysis_version") == ANALYSIS_VERSION:
            out.append(rel.parent)
    return out


def test_committed_releases_rebuild_byte_for_byte(
    committed_releases: dict[Path, CommittedRelease],
) -> None:
    """The analysis of a release's raw data, redone by this servelab, gives the released tables,
    verdicts, report and figures byte for byte: the guard that a change of code leaves every
    analysis output as it was. A change that alters them bumps ANALYSIS_VERSION (older releases
    then name the commit that rebuilds them) and comes with a release made by it. (`verify
    --rebuild` of the tarball: the bundle inside verifies, in the session's one check of each
    release (tests/release_fixtures.py), and its analysis rebuilt from its raw data is the
    same bytes.)"""
    from servelab.evidence.verify import rebuild

    folders = releases_of_this_analysis()
    assert folders, "no committed release was made by this analysis version: cut one"
    for folder in folders:
        check = committed_releases[folder].check
        assert check.failures == [] and check.root is not None, folder
        assert rebuild(check.root) == [], folder


@pytest.mark.parametrize("tag", ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"])
def test_committed_releases_pass_the_archive_bounds(
    tmp_path: Path, tag: str, committed_releases: dict[Path, CommittedRelease]
) -> None:
    """Every committed release tarball extracts within its manifest's bounds and the sizes
    declared beside it, and verifies: checksums, manifest and schemas of the bundle inside,
    whatever servelab made it (a document written in an older format is checked against that
    format's schema, src/servelab/schemas/<name>.v<N>.schema.json, so a new format never
    orphans old evidence). Every committed release of every experiment is verified, once, by
    `committed_releases` (tests/release_fixtures.py); test_verify_release_folder.py reads what
    `servelab verify` said of each."""
    from servelab.evidence.files import release_sizes

    folder = REPO / "evidence" / "quickstart-cpu" / tag
    sizes = release_sizes(folder / "manifest.json")
    root = safe_extract(folder / f"{tag}.tar.gz", tmp_path / "x", sizes)
    assert (root / "manifest.json").read_bytes() == (folder / "manifest.json").read_bytes()
    check = committed_releases[folder].check
    # the bundle inside the tarball: `servelab verify <tarball>`'s checks, prefixed with it
    assert check.failures == [] and check.root is not None
    assert (check.root / "manifest.json").read_bytes() == (root / "manifest.json").read_bytes()
