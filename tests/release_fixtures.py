"""The committed releases (evidence/<experiment>/<tag>/), checked once per test run.

`committed_releases`: every release folder verified once, through `servelab verify` as a person
types it from the repository's root; what it printed, its exit status, and the check it made
(`evidence.verify.check_release_folder`), whose extracted bundle stays for the tests that read
it. `committed_site`: `servelab site`'s build over the committed evidence, once, with the release
history the build computed for each experiment. Tests only read them.

tests/conftest.py imports this module, so that every test can ask for these fixtures (each
pytest-xdist worker makes them once, when its first test asks).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from servelab.evidence.verify import ReleaseFolder

# what tests/conftest.py's `import *` brings in: the fixtures alone
__all__ = ["committed_releases", "committed_site"]

REPO = Path(__file__).resolve().parents[1]
EVIDENCE = REPO / "evidence"
# every committed release folder, whatever its experiment
COMMITTED = sorted(p.parent for p in EVIDENCE.glob("*/*/release.json"))


@dataclass(frozen=True)
class CommittedRelease:
    """One committed release folder, verified once: `servelab verify <folder>` (the folder
    relative to the repository's root, run there) exited `rc` and printed `out`; `checks` is
    every check of a release folder that run made (one, for a release that is not a
    confirmation's), each with its bundle extracted under the session's folder."""

    folder: Path
    rc: int
    out: str
    checks: tuple[ReleaseFolder, ...]

    @property
    def check(self) -> ReleaseFolder:
        """The run's one check of the folder (a failure when it made none, or more)."""
        assert len(self.checks) == 1, f"{self.folder}: {len(self.checks)} checks of the folder"
        return self.checks[0]


@pytest.fixture(scope="session")
def committed_releases(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[Path, CommittedRelease]:
    """Every committed release folder (COMMITTED) verified once by the CLI; the bundle each
    check extracted is kept (read it, never change it)."""
    from servelab.cli import main
    from servelab.evidence import verify as verify_mod

    work = tmp_path_factory.mktemp("committed-releases")
    original = verify_mod.check_release_folder
    made: list[ReleaseFolder] = []

    def keep(path: Path, workdir: Path, do_rebuild: bool = False) -> ReleaseFolder:
        """The check itself, extracting into a folder of the session's (the CLI's own temporary
        folder is removed when it returns)."""
        checked = original(path, work / f"{len(made):03d}", do_rebuild)
        made.append(checked)
        return checked

    out: dict[Path, CommittedRelease] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        mp.setattr(verify_mod, "check_release_folder", keep)
        for folder in COMMITTED:
            before = len(made)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                rc = main(["verify", folder.relative_to(REPO).as_posix()])
            out[folder] = CommittedRelease(folder, rc, printed.getvalue(), tuple(made[before:]))
    return out


@dataclass(frozen=True)
class CommittedSite:
    """`build_site` over the committed evidence: its folder, its result, the lines it said,
    and every release history it computed (as release_history returned it, with the folders
    it was given)."""

    out: Path
    result: Any  # servelab.site.SiteResult
    lines: list[str]
    histories: list[tuple[list[Path], dict[str, Any]]]


@pytest.fixture(scope="session")
def committed_site(tmp_path_factory: pytest.TempPathFactory) -> CommittedSite:
    """The evidence site of the committed releases, built once (read it, never change it)."""
    import copy

    from servelab.site import build_site, history_view

    real = history_view.history_api()
    assert real is not None
    histories: list[tuple[list[Path], dict[str, Any]]] = []

    def release_history(
        experiment: str,
        releases: list[Path],
        workdir: Path,
        checked: Mapping[Path, Any] | None = None,
    ) -> dict[str, Any]:
        history = real.release_history(experiment, releases, workdir, checked=checked)
        histories.append((list(releases), copy.deepcopy(history)))
        return history

    recording = history_view.HistoryApi(
        release_history, real.history_figure, real.history_figure_alt
    )
    out = tmp_path_factory.mktemp("committed-site") / "site"
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(history_view, "history_api", lambda: recording)
        result = build_site(EVIDENCE, out, say=lines.append)
    return CommittedSite(out, result, lines, histories)
