"""`servelab verify` of a release folder (evidence/<experiment>/<tag>/): its tarball against
release.json and the .sha256 beside it, the bundle inside, the copies beside the tarball, and
release.json's experiment and tag; each failure one line naming the file (docs/bundle.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from release_fixtures import CommittedRelease

from servelab.cli import main
from servelab.errors import ServelabError
from servelab.evidence.bundle import _finish
from servelab.evidence.files import safe_extract, write_deterministic_tar
from servelab.evidence.release import release
from servelab.evidence.verify import (
    check_release_folder,
    is_release_folder,
    verification,
    verify,
)
from servelab.reproduce.sides import open_side
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import read_json, write_json

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent for p in (REPO / "evidence").glob("*/*/release.json"))
V7 = REPO / "evidence" / "quickstart-cpu" / "v7"
V7_SHA = read_json(V7 / "release.json")["tarball_sha256"]


def copies_in(folder: Path) -> int:
    """The files of a release folder besides release.json, its tarball and its .sha256."""
    return sum(1 for p in folder.rglob("*") if p.is_file()) - 3


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["verify", *args])
    return rc, capsys.readouterr().out


def test_the_committed_releases_are_v1_to_v9() -> None:
    names = [p.relative_to(REPO / "evidence").as_posix() for p in COMMITTED]
    assert [f"quickstart-cpu/v{n}" for n in range(1, 10)] == [
        n for n in names if n.startswith("quickstart-cpu/")
    ]


@pytest.mark.parametrize("folder", COMMITTED, ids=[p.name for p in COMMITTED])
def test_every_committed_release_folder_verifies(
    folder: Path, committed_releases: dict[Path, CommittedRelease]
) -> None:
    """As a person types it, from the repository's root: one OK line, exit 0 (the session's
    one run of `servelab verify` of each committed release, tests/release_fixtures.py)."""
    given = folder.relative_to(REPO).as_posix()
    rel = read_json(folder / "release.json")
    ran = committed_releases[folder]
    assert (ran.rc, ran.out) == (
        0,
        f"{given}: OK (release {rel['tag']}: tarball sha256 {rel['tarball_sha256'][:12]}..., "
        f"the bundle inside (checksums, manifest, schemas), {copies_in(folder)} extracted "
        "copies)\n",
    )
    assert copies_in(folder) >= 20  # 4 small files, the tables and the figures


@pytest.fixture
def v7(tmp_path: Path) -> Path:
    """A copy of the v7 release folder of every test's own (each tampers with it)."""
    return Path(shutil.copytree(V7, tmp_path / "v7"))


def one_failure(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The single failure of `folder`, the same through the library and the CLI (exit 1)."""
    (failure,) = verify(folder)
    rc, out = cli([str(folder)], capsys)
    assert (rc, out) == (1, f"FAIL {failure}\n")
    return failure


def test_a_tampered_table_copy_is_named(v7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = v7 / "tables" / "points.csv"
    table.write_text(table.read_text(encoding="utf-8").replace("max-num-seqs-8", "max-num-seqs-9"))
    assert one_failure(v7, capsys) == f"{table}: differs from the copy inside v7.tar.gz"


def test_a_file_the_tarball_lacks_is_named(v7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (v7 / "tables" / "extra.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    assert one_failure(v7, capsys) == (
        f"{v7 / 'tables' / 'extra.csv'}: not in v7.tar.gz; a release folder holds only copies "
        "of its tarball's files"
    )


def test_a_missing_copy_is_named(v7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (v7 / "figures" / "ttft_distribution.svg").unlink()
    assert one_failure(v7, capsys) == (
        f"{v7 / 'figures' / 'ttft_distribution.svg'}: missing; a release folder holds a copy of "
        "v7.tar.gz's figures/ttft_distribution.svg"
    )


def test_a_wrong_tarball_sha256_in_release_json_is_named(
    v7: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = read_json(v7 / "release.json")
    rel["tarball_sha256"] = "0" * 64
    write_json(v7 / "release.json", rel)
    assert one_failure(v7, capsys) == (
        f"{v7 / 'v7.tar.gz'}: sha256 {V7_SHA[:12]}... differs from release.json "
        "(000000000000... in tarball_sha256): the release was altered; fetch it again"
    )


def test_a_sha256_file_that_disagrees_is_named(
    v7: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sums = v7 / "v7.tar.gz.sha256"
    sums.write_text(f"{'1' * 64}  v7.tar.gz\n", encoding="utf-8")
    assert one_failure(v7, capsys) == (
        f"{sums}: sha256 111111111111... differs from v7.tar.gz's ({V7_SHA[:12]}...): the "
        "release was altered; fetch it again"
    )
    sums.write_text(f"{V7_SHA}  v6.tar.gz\n", encoding="utf-8")
    assert one_failure(v7, capsys) == f"{sums}: names 'v6.tar.gz', not the tarball v7.tar.gz"
    sums.write_text(f"{V7_SHA} v7.tar.gz\n", encoding="utf-8")
    assert one_failure(v7, capsys) == f"{sums}: not one line `<sha256>  v7.tar.gz`"
    sums.unlink()
    assert one_failure(v7, capsys) == (
        f"{sums}: missing; it holds the tarball's sha256 as `<sha256>  v7.tar.gz`"
    )


def test_a_missing_tarball_is_named(v7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (v7 / "v7.tar.gz").unlink()
    assert one_failure(v7, capsys) == (
        f"{v7 / 'v7.tar.gz'}: missing; release.json names it as the tarball"
    )


def test_release_json_must_be_readable_and_name_a_tarball(
    v7: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = read_json(v7 / "release.json")
    write_json(v7 / "release.json", {**rel, "tarball": "../v6/v6.tar.gz"})
    assert one_failure(v7, capsys) == (
        f"{v7 / 'release.json'}: tarball '../v6/v6.tar.gz' is not the file name of a .tar.gz "
        "in the release folder"
    )
    (v7 / "release.json").write_text("{", encoding="utf-8")
    failure = one_failure(v7, capsys)
    assert failure.startswith(f"{v7 / 'release.json'}: ") and "not valid JSON" in failure


def test_experiment_and_tag_must_be_the_bundles(
    v7: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = read_json(v7 / "release.json")
    write_json(v7 / "release.json", {**rel, "experiment": "other"})
    assert one_failure(v7, capsys) == (
        f"{v7 / 'release.json'}: experiment 'other' is not the bundle's ('quickstart-cpu' in "
        "provenance.json)"
    )
    write_json(v7 / "release.json", {**rel, "tag": "v8"})
    assert one_failure(v7, capsys) == (
        f"{v7 / 'release.json'}: tag 'v8' does not name the tarball v7.tar.gz"
    )


def test_the_bundle_inside_is_verified(v7: Path, tmp_path: Path) -> None:
    """A tarball forged with release.json and its .sha256 rewritten to match: the bundle's own
    checksums name the edited table, prefixed with the tarball's path, and the copy beside it
    is no longer the tarball's."""
    root = safe_extract(v7 / "v7.tar.gz", tmp_path / "x")
    table = root / "tables" / "summary.csv"
    data = bytearray(table.read_bytes())
    at = next(i for i, b in enumerate(data) if chr(b).isdigit() and i > data.index(b"\n"))
    data[at] = ord("1") if data[at] != ord("1") else ord("2")  # same size: extracted, then caught
    table.write_bytes(bytes(data))
    digest = write_deterministic_tar(root, v7 / "v7.tar.gz", root.name)
    write_json(v7 / "release.json", {**read_json(v7 / "release.json"), "tarball_sha256": digest})
    (v7 / "v7.tar.gz.sha256").write_text(f"{digest}  v7.tar.gz\n", encoding="utf-8")
    tarball = v7 / "v7.tar.gz"
    assert verify(v7) == [
        f"{tarball}: tables/summary.csv: sha256 differs from SHA256SUMS",
        f"{tarball}: tables/summary.csv: sha256 differs from manifest.json",
        f"{v7 / 'tables' / 'summary.csv'}: differs from the copy inside v7.tar.gz",
    ]


def test_what_is_a_release_folder(v7: Path, tmp_path: Path) -> None:
    assert is_release_folder(v7)
    assert not is_release_folder(v7 / "v7.tar.gz")
    assert not is_release_folder(v7 / "tables")
    assert not is_release_folder(tmp_path / "absent")
    checked = check_release_folder(v7, tmp_path / "work")
    assert checked.failures == [] and checked.copies == copies_in(v7)
    assert checked.root is not None and (checked.root / "raw").is_dir()
    assert checked.release == read_json(v7 / "release.json")
    result = verification(v7)
    assert result.release == checked.release and result.copies == checked.copies


def test_compare_opens_a_release_folder_through_the_same_checks(v7: Path, tmp_path: Path) -> None:
    """The reproduction's reference refuses what verify names, with its first failure."""
    side = open_side(v7, tmp_path / "ok")
    assert side.kind == "release" and side.release == read_json(v7 / "release.json")
    (v7 / "notes.txt").write_text("not part of the release\n", encoding="utf-8")
    with pytest.raises(ServelabError) as exc:
        open_side(v7, tmp_path / "bad")
    msg = str(exc.value)
    assert msg.startswith(f"{v7}: reference does not verify: {v7 / 'notes.txt'}: not in v7.tar.gz")
    assert "\n" not in msg


def confirmation_of_v7(tmp: Path) -> Path:
    """The release folder of a confirmation whose diagnosing bundle is v7's: v7's bundle with a
    `confirms` block recording v7's manifest.json, made consistent and released (its diagnosing
    bundle beside it in one results folder, as `servelab release` needs)."""
    results = tmp / "results"
    for name in ("quickstart-cpu", "quickstart-cpu-confirm"):
        (results / name).mkdir(parents=True)
        safe_extract(V7 / "v7.tar.gz", tmp / name).rename(results / name / "bundle")
    bundle = results / "quickstart-cpu-confirm" / "bundle"
    prov = read_json(bundle / "provenance.json")
    prov["experiment"] = "quickstart-cpu-confirm"
    prov["confirms"] = {
        "experiment": "quickstart-cpu",
        "bundle": str(results / "quickstart-cpu" / "bundle"),
        "manifest_sha256": sha256_file(V7 / "manifest.json"),
        "changes": [
            {
                "id": "P1",
                "diagnoses": ["serialized"],
                "server_config": "max-num-seqs-1",
                "config": "max-num-seqs-1.max-num-seqs-8",
                "change": {"max-num-seqs": 8},
            }
        ],
        "not_tried": [],
    }
    write_json(bundle / "provenance.json", prov)
    (bundle / "manifest.json").unlink()
    (bundle / "SHA256SUMS").unlink()
    _finish(bundle, "quickstart-cpu-confirm")
    return release(bundle, "v1", tmp / "evidence")


def test_a_confirmation_release_needs_diagnosing(
    v7: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A confirmation's release folder has no diagnosing bundle beside it: the failure says to
    pass --diagnosing, which may be a bundle folder or the diagnosing release's folder."""
    ours = confirmation_of_v7(tmp_path)
    assert read_json(ours / "release.json")["experiment"] == "quickstart-cpu-confirm"
    assert verify(ours) == [
        f"{ours}: a confirmation's release has no diagnosing bundle beside it; pass "
        "--diagnosing DIR (the bundle of quickstart-cpu)"
    ]
    rc, out = cli([str(ours)], capsys)
    assert rc == 1 and out.startswith(f"FAIL {ours}: a confirmation's release has no")
    assert verify(ours, diagnosing=tmp_path / "results" / "quickstart-cpu" / "bundle") == []
    checked = verification(ours, diagnosing=v7)
    assert checked.failures == [] and checked.diagnosing == v7
    assert checked.manifest_sha256 == sha256_file(v7 / "manifest.json")
    rc, out = cli([str(ours), "--diagnosing", str(v7)], capsys)
    assert rc == 0 and f"diagnosing bundle {v7}: holds" in out
    assert f"{ours}: OK (release v1: tarball sha256 " in out
    # the diagnosing release's own failures name its files in full
    (v7 / "report.md").write_text("# edited\n", encoding="utf-8")
    assert verify(ours, diagnosing=v7) == [
        f"{v7 / 'report.md'}: differs from the copy inside v7.tar.gz"
    ]
    with pytest.raises(ServelabError, match="not a confirmation's bundle"):
        verify(v7, diagnosing=ours)
