"""`build_site`: the static site over an evidence folder. Each release is verified while the
site is built (a release that does not verify is shown as such, never silently), its files
are copied beside its page, and nothing is written outside the site's folder. Same evidence,
same bytes: no build date, no absolute path, everything sorted."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from servelab.errors import ServelabError
from servelab.evidence.files import walk_files
from servelab.evidence.schemas import validate_file
from servelab.site import history_view, layout, pages, release_view
from servelab.site.check import CheckedRelease, check_release
from servelab.site.release_records import CopiedFile, ProfilesSection, ReleaseRow, Tarball
from servelab.site.reproduction_view import ReproductionView, SideView, reproduction_view
from servelab.site.scan import (
    EvidenceDir,
    ExperimentDir,
    ReleaseDir,
    ReproductionDir,
    scan_evidence,
)
from servelab.store.jsonio import read_json
from servelab.store.paths import PROFILE_FILE

Say = Callable[[str], None]
MARKER_TEXT = "A site built by `servelab site`; `servelab site` may replace this folder.\n"


@dataclass(frozen=True)
class SiteResult:
    """What was built: the site's folder, its index, every page (site paths, in the order
    written) and each release that does not verify with its failures."""

    out: Path
    index: Path
    pages: tuple[str, ...]
    not_verified: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class BuiltRelease:
    """A release as the index, the history and the reproductions refer to it; `checked`: its
    verification, whose extracted bundle the history reads (each release is verified and
    extracted once per build)."""

    rel: ReleaseDir
    page: str
    experiment: str
    tarball_sha256: str | None
    failures: tuple[str, ...]
    row: ReleaseRow
    checked: CheckedRelease


class HistoryPage(TypedDict):
    """The history page's context beside its title: the history (None when there is none,
    with the error), each release's page and the releases in order."""

    h: history_view.HistoryView | None
    error: str | None
    pages: dict[str, str]
    releases: list[tuple[str, str]]


class ReproductionRow(TypedDict):
    """A reproduction in the index: its page, its verdict (absent when unreadable, with the
    error) and its sides in a few words ("-" when unreadable)."""

    name: str
    href: str
    error: str | None
    verdict: NotRequired[str]
    verdict_text: NotRequired[str]
    css: NotRequired[str]
    reference: NotRequired[str]
    fresh: NotRequired[str]


@dataclass
class Site:
    """The site's folder being written, with the progress lines."""

    out: Path
    say: Say
    pages: list[str] = field(default_factory=list)

    def write(self, path: str, data: bytes) -> None:
        target = self.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def copy(self, src: Path, path: str) -> None:
        target = self.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)

    def page(self, path: str, template: str, what: str, title: str, **context: object) -> None:
        self.write(path, pages.render(template, path, title, **context).encode("utf-8"))
        self.pages.append(path)
        self.say(f"site: {path} ({what})")


def _prepare(out: Path, evidence: Path) -> None:
    """An empty --out, or a site built before (replaced); never the evidence folder, a
    folder inside it or one holding it."""
    o, e = out.resolve(), evidence.resolve()
    if o == e or e in o.parents or o in e.parents:
        raise ServelabError(
            f"--out {out}: overlaps the evidence folder {evidence}; choose a folder outside "
            "it, e.g. build/site"
        )
    if out.exists() and not out.is_dir():
        raise ServelabError(f"--out {out}: not a folder; choose a folder, e.g. build/site")
    if out.is_dir() and any(out.iterdir()):
        if not (out / layout.MARKER).is_file():
            raise ServelabError(
                f"--out {out}: not empty and not a site `servelab site` built; choose an "
                "empty or new folder, e.g. build/site"
            )
        for child in sorted(out.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _copy_folder(site: Site, src: Path, dest: str) -> list[CopiedFile]:
    """Every file of `src` copied under the site path `dest`: (path, bytes) each; none when
    the folder holds a link (the verification names it)."""
    try:
        files = walk_files(src)
    except ServelabError:
        return []
    for rel in files:
        site.copy(src / rel, f"{dest}/{rel}")
    return [{"path": rel, "bytes": (src / rel).stat().st_size} for rel in files]


def build_site(evidence: Path, out: Path, say: Say = print) -> SiteResult:
    """Build the site of the evidence folder `evidence` into `out`; `say` gets a line per
    page and a warning per release that does not verify."""
    found = scan_evidence(evidence)
    _prepare(out, evidence)
    site = Site(out, say)
    built: list[BuiltRelease] = []
    with tempfile.TemporaryDirectory(prefix="servelab-site-") as tmp:
        work = [Path(tmp) / f"{n:03d}" for n in range(len(found.experiments))]
        for exp, w in zip(found.experiments, work, strict=True):
            for i, rel in enumerate(exp.releases):
                built.append(_release(site, rel, w / f"{i:03d}"))
        for exp, w in zip(found.experiments, work, strict=True):
            mine = [b for b in built if b.rel.path.parent == exp.path]
            _history(site, exp, mine, w / "history")
            shutil.rmtree(w, ignore_errors=True)  # its releases' bundles, read by the history
    rows = [_reproduction(site, rp, built) for rp in found.reproductions]
    _index(site, found, built, rows)
    site.write(layout.STYLE, pages.stylesheet())
    site.write(layout.MARKER, MARKER_TEXT.encode("utf-8"))
    failing = tuple((f"{b.rel.experiment}/{b.rel.tag}", b.failures) for b in built if b.failures)
    return SiteResult(out, out / layout.INDEX, tuple(site.pages), failing)


def _release(site: Site, rel: ReleaseDir, workdir: Path) -> BuiltRelease:
    """Verify one release, copy its files and write its page. The bundle its tarball holds
    stays extracted in `workdir` for the history when the release verifies."""
    page = layout.release_page(rel.experiment, rel.tag)
    checked = check_release(rel.path, workdir)
    failures = checked.failures
    files = _copy_folder(site, rel.path, layout.release_files(rel.experiment, rel.tag))
    profiles = _profiles(site, rel, checked.bundle, page)
    if failures:  # the history never reads its bundle
        shutil.rmtree(workdir, ignore_errors=True)
    r = release_view.release_context(rel, page, files, failures)
    r["tarball"] = _tarball(rel, page, checked, files)
    r["profiles"] = profiles
    r["toc"] = [t for t in r["toc"] if t[0] != "profile" or profiles["error"] or profiles["rows"]]
    title = f"{r['experiment']} {rel.tag}"
    site.page(
        page,
        "release.html",
        f"release {rel.tag}: " + ("does not verify" if failures else "verifies"),
        title=title,
        crumbs=[("Evidence", layout.href(page, layout.INDEX)), (title, None)],
        r=r,
    )
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        site.say(f"warning: {rel.experiment}/{rel.tag} does not verify: {failures[0]}{more}")
    row: ReleaseRow = {
        **r["row"],
        "href": layout.href(layout.INDEX, page),
        "href_failures": layout.href(layout.INDEX, page, "verification"),
    }
    return BuiltRelease(rel, page, r["experiment"], checked.sha256, tuple(failures), row, checked)


def _tarball(
    rel: ReleaseDir, page: str, checked: CheckedRelease, files: list[CopiedFile]
) -> Tarball | None:
    if checked.tarball is None or checked.tarball not in {f["path"] for f in files}:
        return None
    target = f"{layout.release_files(rel.experiment, rel.tag)}/{checked.tarball}"
    return {
        "name": checked.tarball,
        "href": layout.href(page, target),
        "sha256": str(checked.sha256),
    }


def _profiles(site: Site, rel: ReleaseDir, bundle: Path | None, page: str) -> ProfilesSection:
    """The profile summaries of the bundle inside the tarball, their files copied beside the
    page."""
    try:
        rows = release_view.profiles(bundle)
    except release_view.READ_ERRORS as exc:
        return {"error": f"profile: {exc}", "rows": []}
    assert bundle is not None or not rows
    dest = layout.release_bundle(rel.experiment, rel.tag)
    for p in rows:
        links = {}
        for name, key in (("profile.md", "markdown"), (PROFILE_FILE, "json")):
            src = bundle / "profile" / p["server_config"] / name if bundle else None
            if src is not None and src.is_file():
                target = f"{dest}/profile/{layout.file_name(p['server_config'])}/{name}"
                site.copy(src, target)
                links[key] = layout.href(page, target)
        p["markdown"], p["json"] = links.get("markdown"), links.get("json")
        p["id"] = layout.anchor(p["server_config"])
    return {"error": None, "rows": rows}


def _history(site: Site, exp: ExperimentDir, built: list[BuiltRelease], workdir: Path) -> None:
    """The experiment's history page, from `history.release_history` over its releases in
    tag order (given their checks: no release is verified again), with a figure per metric."""
    page = layout.history_page(exp.name)
    name = built[0].experiment if built else exp.name
    links = {b.rel.tag: layout.href(page, b.page) for b in built}
    releases = sorted(links.items(), key=lambda t: [b.rel.tag for b in built].index(t[0]))
    context: HistoryPage = {"h": None, "error": None, "pages": links, "releases": releases}
    api = history_view.history_api()
    if api is None:
        context["error"] = (
            "This servelab has no release history: metrics across releases are not shown."
        )
    else:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            # with the checks `_release` made, so that no release is verified twice
            checked = {b.rel.path: b.checked for b in built}
            history = api.release_history(
                name, [b.rel.path for b in built], workdir, checked=checked
            )
            figures = {}
            for metric in history["metrics"]:
                target = layout.history_figure(exp.name, str(metric))
                site.write(target, api.history_figure(history, metric))
                figures[str(metric)] = {
                    "src": layout.href(page, target),
                    "alt": api.history_figure_alt(history, metric),
                }
            failures = {b.rel.tag: list(b.failures) for b in built}
            context["h"] = history_view.history_view(history, figures, failures)
        except ServelabError as exc:
            context["error"] = f"The history could not be built: {exc}"
            site.say(f"warning: {exp.name}: the history could not be built: {exc}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    title = f"History of {name}"
    crumbs = [("Evidence", layout.href(page, layout.INDEX)), (title, None)]
    site.page(
        page,
        "history.html",
        f"history of {name}",
        title=title,
        crumbs=crumbs,
        experiment=name,
        **context,
    )


def _finder(
    page: str, built: list[BuiltRelease]
) -> Callable[[str | None, str | None, str | None], str | None]:
    """The link from `page` to the site's page of a release named by experiment, tag and
    (when given) tarball sha256."""

    def find(experiment: str | None, tag: str | None, sha256: str | None) -> str | None:
        for b in built:
            if (
                b.experiment == experiment
                and b.rel.tag == tag
                and sha256 in (None, b.tarball_sha256)
            ):
                return layout.href(page, b.page)
        return None

    return find


def _reproduction(site: Site, rp: ReproductionDir, built: list[BuiltRelease]) -> ReproductionRow:
    """One reproduction's page (its files copied beside it); its row of the index."""
    page = layout.reproduction_page(rp.name)
    files = _copy_folder(site, rp.path, layout.reproduction_files(rp.name))
    for f in files:
        f["href"] = layout.href(page, f"{layout.reproduction_files(rp.name)}/{f['path']}")
    record = rp.path / "reproduction.json"
    view: ReproductionView | None = None
    error = None
    try:
        validate_file(record, "reproduction", "reproduction.json")
        view = reproduction_view(read_json(record), _finder(page, built))
    except release_view.READ_ERRORS as exc:
        error = str(exc).replace(f"{rp.path}/", "")
    toc = [
        ("verdict", "Verdict"),
        ("differs", "What differs"),
        ("claims", "Claims"),
        ("orderings", "Orderings"),
        ("points", "Points"),
    ]
    title = f"Reproduction {rp.name}"
    crumbs = [("Evidence", layout.href(page, layout.INDEX)), (title, None)]
    what = f"reproduction: {view['verdict']}" if view else "reproduction: unreadable"
    site.page(
        page,
        "reproduction.html",
        what,
        title=title,
        crumbs=crumbs,
        name=rp.name,
        v=view,
        error=error,
        files=files,
        toc=[*(toc if view else []), ("files", "Files")],
    )
    if error:
        site.say(f"warning: {rp.name}: reproduction.json unreadable: {error}")
    href = layout.href(layout.INDEX, page)
    row: ReproductionRow = {"name": rp.name, "href": href, "error": error}
    if view is not None:
        row["verdict"], row["verdict_text"], row["css"] = (
            view["verdict"],
            view["verdict_text"],
            view["css"],
        )
        row["reference"], row["fresh"] = _side_text(view["reference"]), _side_text(view["fresh"])
    else:
        row["reference"], row["fresh"] = "-", "-"
    return row


def _side_text(s: SideView) -> str:
    """A side in the index: its experiment and tag (or its path)."""
    return " ".join(str(x) for x in (s["experiment"], s["tag"] or s["path"]) if x)


def _index(
    site: Site, found: EvidenceDir, built: list[BuiltRelease], repros: list[ReproductionRow]
) -> None:
    experiments = [
        {
            "name": exp.name,
            "id": "experiment-" + layout.anchor(exp.name),
            "history": layout.href(layout.INDEX, layout.history_page(exp.name)),
            "releases": [b.row for b in built if b.rel.path.parent == exp.path],
        }
        for exp in found.experiments
    ]
    failing = sum(1 for b in built if b.failures)
    what = f"{len(built)} releases, {failing} not verifying, {len(repros)} reproductions"
    site.page(
        layout.INDEX,
        "index.html",
        what,
        title="Evidence",
        crumbs=[("Evidence", None)],
        experiments=experiments,
        reproductions=repros,
    )
