"""Whether a release folder verifies, every failure one line naming the file inside the release.

`servelab verify`'s check of a release folder (evidence.verify.check_release_folder): the
tarball's sha256 against release.json and its .sha256 file, its members against the
manifest.json beside it before anything is extracted (docs/bundle.md, "What an archive must
satisfy"), the bundle inside with the checks of a bundle folder, and every other file of the
folder against the tarball's own copy. The extracted bundle of a release that verifies stays in
the work folder until its experiment's pages are built: the profile summaries and the release
history read it, so no release is verified or extracted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.errors import ServelabError
from servelab.evidence.verify import check_release_folder


@dataclass(frozen=True)
class CheckedRelease:
    """A release folder checked: its tarball extracted (`bundle`, None when it was not: missing,
    altered or unsafe), the tarball and its sha256 as release.json names them, and every
    failure."""

    bundle: Path | None
    tarball: str | None
    sha256: str | None
    failures: list[str]


def check_release(folder: Path, workdir: Path) -> CheckedRelease:
    """Verify the release folder `folder`, extracting its tarball into `workdir`."""
    try:
        checked = check_release_folder(folder, workdir)
    except ServelabError as exc:  # a tarball that cannot be extracted safely
        return CheckedRelease(None, None, None, relative([str(exc)], folder, workdir))
    rel = checked.release
    tarball, sha256 = rel.get("tarball"), rel.get("tarball_sha256")
    return CheckedRelease(
        checked.root,
        tarball if isinstance(tarball, str) else None,
        sha256 if isinstance(sha256, str) else None,
        relative(checked.failures, folder, workdir),
    )


def relative(lines: list[str], *folders: Path) -> list[str]:
    """`lines` with the given folders' paths left out: a failure names the file inside the
    release, never where the evidence lay when the site was built."""
    out = []
    for line in lines:
        for f in folders:
            for prefix in sorted({f"{f}/", f"{f.resolve()}/"}, key=len, reverse=True):
                line = line.replace(prefix, "")
        out.append(line)
    return out
