"""`servelab release`: freeze a verified bundle into evidence/<experiment>/<tag>/."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from servelab.documents.declared import Provenance
from servelab.errors import ServelabError
from servelab.evidence.files import write_deterministic_tar
from servelab.evidence.verify import RELEASE_COPIES, RELEASE_COPY_FOLDERS, verify
from servelab.store.jsonio import read_json, write_json

TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def unpinned_reasons(prov: Provenance) -> list[str]:
    reasons = []
    model = prov["model"]
    rev = str(model.get("revision", ""))
    if model.get("source") == "endpoint" or prov["runtime"].get("kind") == "endpoint":
        reasons.append(
            "the server was not launched by servelab (runtime.kind endpoint): its model and "
            "runtime are not pinned"
        )
    elif model.get("source") == "tiny":
        if not HEX64.match(rev):
            reasons.append(f"tiny model revision {rev!r} is not a 64-hex digest")
    elif not HEX40.match(rev):
        reasons.append(f"model revision {rev!r} is not a 40-hex commit")
    rt = prov["runtime"]
    if rt.get("kind") == "venv" and not HEX64.match(str(rt.get("lock_sha256", ""))):
        reasons.append("runtime lock has no sha256")
    if (
        rt.get("kind") == "container"
        and not re.match(r"^sha256:[0-9a-f]{64}$", str(rt.get("image_digest") or ""))
        and not HEX64.match(str(rt.get("image_sha256") or ""))
    ):
        reasons.append(f"image {rt.get('image')!r} is not pinned by digest")
    pipe = prov["pipeline"]
    if pipe.get("git_commit") is None:
        reasons.append("the pipeline is not in a git checkout")
    elif pipe.get("git_dirty"):
        reasons.append("the git tree has uncommitted changes")
    return reasons


def release(bundle: Path, tag: str, evidence_root: Path, allow_unpinned: bool = False) -> Path:
    if not TAG.match(tag):
        raise ServelabError(f"--tag {tag!r}: use letters, digits, '.', '_' and '-'")
    failures = verify(bundle)
    if failures:
        raise ServelabError(f"{bundle}: does not verify: {failures[0]}")
    prov = read_json(bundle / "provenance.json")
    dest: Path = evidence_root / str(prov["experiment"]) / tag
    if dest.exists() and any(dest.iterdir()):
        raise ServelabError(f"{dest}: tag {tag!r} exists; releases are immutable, choose a new tag")
    reasons = unpinned_reasons(prov)
    if reasons and not allow_unpinned:
        raise ServelabError(
            f"{bundle}: not releasable: {'; '.join(reasons)} "
            "(fix it, or pass --allow-unpinned to release it marked unpinned)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    try:
        for name in RELEASE_COPIES:
            shutil.copyfile(bundle / name, dest / name)
        for sub in RELEASE_COPY_FOLDERS:
            if (bundle / sub).is_dir():
                shutil.copytree(bundle / sub, dest / sub)
        digest = write_deterministic_tar(
            bundle, dest / f"{tag}.tar.gz", f"{prov['experiment']}-{tag}"
        )
        (dest / f"{tag}.tar.gz.sha256").write_text(f"{digest}  {tag}.tar.gz\n", encoding="utf-8")
        write_json(
            dest / "release.json",
            {
                "format_version": 1,
                "experiment": prov["experiment"],
                "tag": tag,
                "tarball": f"{tag}.tar.gz",
                "tarball_sha256": digest,
                "pinned": not reasons,
                "unpinned_reasons": reasons,
            },
        )
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest
