"""`servelab site`: the static evidence site over the committed releases, and over an evidence
folder with a tampered release and a real reproduction (v6 as reference, v5 as fresh)."""

from __future__ import annotations

import contextlib
import html as htmllib
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from release_fixtures import CommittedSite
from test_site_history import count_release_checks

from servelab.errors import ServelabError
from servelab.site import SiteResult, build_site, history_view, layout, pages
from servelab.site.check import CheckedRelease
from servelab.site.scan import scan_evidence, tag_key

REPO = Path(__file__).resolve().parents[1]
EVIDENCE = REPO / "evidence"
TAGS = ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"]


class Page(HTMLParser):
    """The links, ids, images and table headers of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (tag, href or src)
        self.ids: set[str] = set()
        self.imgs: list[dict[str, str | None]] = []
        self.ths: list[dict[str, str | None]] = []
        self.tables = 0
        self.wrapped_tables = 0
        self.open_wraps: list[bool] = []
        self.html_lang: str | None = None
        self.viewport = False
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append((tag, str(a[key])))
        if tag == "html":
            self.html_lang = a.get("lang")
        if tag == "meta" and a.get("name") == "viewport":
            self.viewport = "width=device-width" in str(a.get("content"))
        if tag == "img":
            self.imgs.append(a)
        if tag == "th":
            self.ths.append(a)
        if tag == "script":
            self.scripts += 1
        if tag == "div":
            self.open_wraps.append("table-wrap" in str(a.get("class")))
        if tag == "table":
            self.tables += 1
            self.wrapped_tables += any(self.open_wraps)

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self.open_wraps:
            self.open_wraps.pop()


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def files_of(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


INLINE = r"</?(?:a|span|code|strong|em)\b[^>]*>"


def plain(html: str) -> str:
    """An HTML page's text: inline tags dropped, the others a space, entities decoded,
    whitespace collapsed."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", re.sub(INLINE, "", html))).split())


def text(path: Path) -> str:
    return plain(path.read_text(encoding="utf-8"))


@pytest.fixture
def committed(committed_site: CommittedSite) -> tuple[Path, SiteResult, list[str]]:
    """The site of the committed evidence, built once per test run (tests/release_fixtures.py:
    test_site_browser.py loads the same site in Chromium)."""
    return committed_site.out, committed_site.result, committed_site.lines


@pytest.fixture(scope="module")
def tampered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An evidence folder with v5 (tampered: a claim's verdict edited, diagnoses.json made
    unreadable), v6 as released, and the reproduction of v6 by v5 that `servelab compare`
    writes."""
    from servelab.reproduce import compare

    root = tmp_path_factory.mktemp("evidence") / "evidence"
    for tag in ("v5", "v6"):
        shutil.copytree(EVIDENCE / "quickstart-cpu" / tag, root / "quickstart-cpu" / tag)
    claims = root / "quickstart-cpu" / "v5" / "tables" / "claims.json"
    claims.write_text(claims.read_text().replace('"holds"', '"fails"', 1))
    (root / "quickstart-cpu" / "v5" / "tables" / "diagnoses.json").write_text("not json\n")
    with contextlib.chdir(REPO):  # the reproduction records the paths it was given: relative ones
        compare(
            Path("evidence/quickstart-cpu/v6"),
            Path("evidence/quickstart-cpu/v5"),
            out=root / "quickstart-cpu" / "reproductions" / "v6-vs-v5",
        )
    return root


@pytest.fixture(scope="module")
def tampered_build(
    tampered: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, SiteResult, list[str], list[str]]:
    """The site of the tampered evidence: its folder, its result, the lines it said, and
    every check of a release folder the build made (test_site_history.count_release_checks),
    as the folders' names."""
    out = tmp_path_factory.mktemp("tampered") / "site"
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        checked = count_release_checks(mp)
        result = build_site(tampered, out, say=lines.append)
    return out, result, lines, list(checked)


@pytest.fixture
def tampered_site(
    tampered_build: tuple[Path, SiteResult, list[str], list[str]],
) -> tuple[Path, SiteResult, list[str]]:
    out, result, lines, _ = tampered_build
    return out, result, lines


# --- the committed evidence ---------------------------------------------------------------


def test_index_lists_every_committed_release_in_tag_order_and_verified(
    committed: tuple[Path, SiteResult, list[str]],
) -> None:
    out, result, lines = committed
    assert result.index == out / "index.html" and result.not_verified == ()
    html = (out / "index.html").read_text()
    rows = re.findall(
        r'<th scope="row"><a href="experiments/quickstart-cpu/(v\d+)/index.html">', html
    )
    assert rows == TAGS
    page = text(out / "index.html")
    assert html.count('<span class="verdict v-holds">verifies</span>') == len(TAGS)
    assert "v-fails" not in html
    # claims held/total and valid points, from each release's own tables
    assert re.search(
        r"v7 2026-12-03 Intel\(R\) Xeon\(R\) Processor \(GenuineIntel family 6 model 167\), ISA class avx512_bf16\+amx 9c955a2ad2e7 0\.1\.0 0\.32\.0 4/4 29/30 verifies",
        page,
    )
    assert re.search(
        r"v1 2026-11-30 AMD EPYC, ISA class not recorded ec520f1a81cf 0\.1\.0 0\.32\.0 4/4 not checked verifies",
        page,
    )
    assert 'href="experiments/quickstart-cpu/history.html"' in html
    assert [line for line in lines if line.startswith("warning")] == []
    assert (
        sum(1 for line in lines if line.startswith("site: ")) == len(result.pages) == len(TAGS) + 2
    )


def test_release_page_shows_claims_figures_points_validity_diagnoses_host_and_files(
    committed: tuple[Path, SiteResult, list[str]],
) -> None:
    out, _, _ = committed
    v7 = out / "experiments" / "quickstart-cpu" / "v7"
    page = text(v7 / "index.html")
    sha = json.loads((EVIDENCE / "quickstart-cpu" / "v7" / "release.json").read_text())[
        "tarball_sha256"
    ]
    assert f"v7.tar.gz, sha256 {sha}" in page
    assert "4 of 4 claims hold" in page
    assert (
        "throughput[config=max-num-seqs-8,c=16] > 1.5 * throughput[config=max-num-seqs-1,c=16] holds mean difference 174.8% over 3 paired repeats, 3/3 agree, p = 1.739e-05 (a > b)"
        in page
    )
    # summary.csv's mean and CI of max-num-seqs-8 at c=1 (2 repeats: one point invalid)
    assert "52.92 [" in page and "29 of 30 points valid" in page
    assert (
        "max-num-seqs-8 3 1 contention failed 0.28 CPU cores busy outside the server, client and samplers (limit 0.25)"
        in page
    )
    assert (
        "Proposal: --max-num-seqs 8 on max-num-seqs-1; expected: output throughput at least 1.5x max-num-seqs-1's at concurrency 4, 8 and 16"
        in page
    )
    assert "ISA class avx512_bf16+amx" in page and "PyTorch AVX512" in page
    assert (
        "Localisation: c0001 -> c0008: +964 µs per output token, 87% of it (+837 µs) in gemm"
        in page
    )
    # the figures: the release's own SVG bytes, each with a text alternative
    imgs = parse(v7 / "index.html").imgs
    assert len(imgs) == 6 and all(len(str(i["alt"])) > 40 for i in imgs)
    for name in ("throughput_vs_concurrency.svg", "utilization_vs_throughput.svg"):
        copied = v7 / "files" / "figures" / name
        assert (
            copied.read_bytes()
            == (EVIDENCE / "quickstart-cpu" / "v7" / "figures" / name).read_bytes()
        )
    assert (v7 / "files" / "v7.tar.gz").read_bytes() == (
        EVIDENCE / "quickstart-cpu" / "v7" / "v7.tar.gz"
    ).read_bytes()
    assert (v7 / "bundle" / "profile" / "max-num-seqs-1" / "profile.md").is_file()


def test_a_release_without_validity_records_says_so(
    committed: tuple[Path, SiteResult, list[str]],
) -> None:
    out, _, _ = committed
    page = text(out / "experiments" / "quickstart-cpu" / "v1" / "index.html")
    assert "This release records no validity checks" in page
    assert "CPU facts not recorded" in page


def test_every_page_is_plain_and_accessible(committed: tuple[Path, SiteResult, list[str]]) -> None:
    out, result, _ = committed
    for rel in result.pages:
        p = parse(out / rel)
        assert p.html_lang == "en" and p.viewport and p.scripts == 0, rel
        assert all(i.get("alt") for i in p.imgs), rel
        assert all(th.get("scope") in ("col", "row") for th in p.ths), rel
        assert p.tables == p.wrapped_tables, f"{rel}: a table outside its scrolling wrapper"
    css = (out / "style.css").read_text()
    assert re.search(r"\.table-wrap \{[^}]*overflow-x: auto", css)
    assert "@media (max-width: 600px)" in css
    assert "url(" not in css and "@import" not in css


def check_links(out: Path) -> int:
    """Every href and src of every page is relative and names a file of the site (and an id
    of that page, for a #fragment); the number of links checked."""
    checked = 0
    ids = {p: parse(p).ids for p in out.rglob("*.html")}
    for page in sorted(out.rglob("*.html")):
        for tag, link in parse(page).links:
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc and not link.startswith("/"), (
                f"{page}: {link}"
            )
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            assert target.is_file() and out.resolve() in target.parents, f"{page}: {tag} {link}"
            if parts.fragment:
                assert parts.fragment in ids[target], f"{page}: {link}: no such id"
            checked += 1
    return checked


def test_every_link_is_relative_and_resolves(committed: tuple[Path, SiteResult, list[str]]) -> None:
    out, _, _ = committed
    assert check_links(out) > 200


def test_no_absolute_path_or_network_reference(
    committed: tuple[Path, SiteResult, list[str]],
) -> None:
    out, result, _ = committed
    for rel in [*result.pages, layout.STYLE]:
        content = (out / rel).read_text()
        assert str(REPO) not in content and str(out) not in content, rel
        assert not re.search(r"(href|src)=\"(https?:)?//", content), rel


def test_tag_number_order() -> None:
    assert sorted(["v10", "v2", "v1", "v1.1"], key=tag_key) == ["v1", "v1.1", "v2", "v10"]


def test_scan_finds_releases_and_reproductions(tmp_path: Path) -> None:
    for tag in ("v10", "v2", "v1"):
        (tmp_path / "exp" / tag).mkdir(parents=True)
        (tmp_path / "exp" / tag / "release.json").write_text("{}")
    (tmp_path / "exp" / "reproductions" / "a").mkdir(parents=True)
    (tmp_path / "exp" / "reproductions" / "a" / "reproduction.json").write_text("{}")
    found = scan_evidence(tmp_path)
    assert [e.name for e in found.experiments] == ["exp"]
    assert [r.tag for r in found.experiments[0].releases] == ["v1", "v2", "v10"]
    assert [r.name for r in found.reproductions] == ["exp/reproductions/a"]


# --- a tampered release and a reproduction ------------------------------------------------


def test_a_tampered_release_shows_as_not_verifying(
    tampered_site: tuple[Path, SiteResult, list[str]],
) -> None:
    out, result, lines = tampered_site
    assert [label for label, _ in result.not_verified] == ["quickstart-cpu/v5"]
    failures = dict(result.not_verified)["quickstart-cpu/v5"]
    assert "tables/claims.json: differs from the copy inside v5.tar.gz" in failures
    assert "tables/diagnoses.json: differs from the copy inside v5.tar.gz" in failures
    assert any(
        line.startswith("warning: quickstart-cpu/v5 does not verify: ") and "tables/" in line
        for line in lines
    )
    index = text(out / "index.html")
    assert re.search(
        r"v5 .* does not verify 2 failures: tables/claims.json: differs from the copy inside v5.tar.gz",
        index,
    )
    assert re.search(r"v6 .* 4/4 .* verifies", index)
    page = text(out / "experiments" / "quickstart-cpu" / "v5" / "index.html")
    assert "does not verify This release failed 2 checks" in page
    assert "3 of 4 claims hold" in page  # what its files say, shown under the failure
    assert (
        "diagnoses: tables/diagnoses.json" in page
    )  # an unreadable table is named, the page still shows


def test_reproduction_page_compares_claim_by_claim(
    tampered: Path, tampered_site: tuple[Path, SiteResult, list[str]]
) -> None:
    out, _, _ = tampered_site
    record = json.loads(
        (
            tampered / "quickstart-cpu" / "reproductions" / "v6-vs-v5" / "reproduction.json"
        ).read_text()
    )
    page_path = (
        out / "reproductions" / "quickstart-cpu" / "reproductions" / "v6-vs-v5" / "index.html"
    )
    page = text(page_path)
    assert record["verdict_text"] in page and record["why"] in page
    for c in record["claims"]:
        assert c["claim"] in page
    assert f"Host class: {record['host']['class']}" in page
    # what differs is said once, before the claims, and the claims say only their verdicts
    differs = page.index("Every host fact, engine setting and runtime field that differs")
    claims = page.index("Every claim of the reference")
    assert differs < claims
    assert "runtime pipeline.git_commit" in page[differs:claims]
    # v6 and v5 were made before the servers' engine settings were recorded: said, no failure
    assert (
        "max-num-seqs-8: effective configuration not recorded in the reference or the fresh run"
        in page[differs:claims]
    )
    assert page.count(record["verdict_text"]) == 1
    # v5 and v6 record no host-speed canary; the point tests are under Benjamini-Hochberg
    assert (
        "Host speed: not recorded (neither the reference nor the fresh run measured the canary)."
        in page
    )
    assert (
        f"under Benjamini-Hochberg: false discovery rate 5% over the {record['fdr']['tests']} "
        "tests of this comparison" in page
    )
    assert "Against the host" in page and "no real change at the 5% false discovery rate" in page
    # the reference is one of the site's releases: its page is linked
    links = [link for _, link in parse(page_path).links]
    assert "../../../../experiments/quickstart-cpu/v6/index.html" in links
    assert "../../../../experiments/quickstart-cpu/v5/index.html" in links
    index = text(out / "index.html")
    assert (
        f"quickstart-cpu/reproductions/v6-vs-v5 quickstart-cpu v6 quickstart-cpu v5 {record['verdict_text']}"
        in index
    )
    assert check_links(out) > 50


@pytest.fixture(scope="module")
def cli_build(tampered: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`servelab site` on the tampered evidence, into a folder of its own: its exit status,
    what it printed, and the evidence and the folder around --out before and after."""
    from servelab.cli import main

    work = tmp_path_factory.mktemp("cli")
    before = files_of(tampered)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["site", str(tampered), "--out", str(work / "site")])
    return {
        "out": work / "site",
        "rc": rc,
        "lines": printed.getvalue().splitlines(),
        "evidence_unchanged": files_of(tampered) == before,
        "around": sorted(p.name for p in work.iterdir()),
    }


def test_cli_builds_warns_and_exits_zero(cli_build: dict[str, Any]) -> None:
    assert cli_build["rc"] == 0
    lines = cli_build["lines"]
    assert "site: index.html (2 releases, 1 not verifying, 1 reproductions)" in lines
    assert any(line.startswith("warning: quickstart-cpu/v5 does not verify: ") for line in lines)
    last = lines[-1]
    assert last.startswith(
        "site: 5 pages, 1 release(s) that do not verify (shown as such); open file://"
    )
    assert last.endswith(
        f"/index.html in a browser, or serve it: python -m http.server -d {cli_build['out']}"
    )


def test_the_same_evidence_gives_the_same_bytes(
    tampered_site: tuple[Path, SiteResult, list[str]], cli_build: dict[str, Any]
) -> None:
    a, b = files_of(tampered_site[0]), files_of(cli_build["out"])
    assert sorted(a) == sorted(b) and len(a) > 60
    assert [name for name in a if a[name] != b[name]] == []


def test_nothing_is_written_outside_out(cli_build: dict[str, Any]) -> None:
    assert cli_build["evidence_unchanged"]
    assert cli_build["around"] == ["site"]


# --- refusals and rebuilds ----------------------------------------------------------------


@pytest.mark.parametrize("which", ["missing", "empty"])
def test_missing_or_empty_evidence_is_one_line_exit_2(
    which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servelab.cli import main

    evidence = tmp_path / "evidence"
    if which == "empty":
        evidence.mkdir()
    assert main(["site", str(evidence), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"servelab: {evidence}: ")
    assert not (tmp_path / "site").exists()


def test_out_must_not_overlap_evidence_nor_be_foreign(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    (evidence / "exp" / "reproductions").mkdir(parents=True)
    (evidence / "exp" / "reproductions" / "reproduction.json").write_text("{}")
    with pytest.raises(ServelabError, match="overlaps the evidence folder"):
        build_site(evidence, evidence / "site", say=lambda _: None)
    with pytest.raises(ServelabError, match="overlaps the evidence folder"):
        build_site(evidence, tmp_path, say=lambda _: None)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ServelabError, match="not empty and not a site"):
        build_site(evidence, foreign, say=lambda _: None)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_a_site_built_before_is_replaced(tmp_path: Path) -> None:
    """An unreadable reproduction is shown as such; a second build removes what the first
    left and the evidence no longer has."""
    evidence = tmp_path / "evidence"
    (evidence / "r").mkdir(parents=True)
    (evidence / "r" / "reproduction.json").write_text("{}")
    out = tmp_path / "site"
    build_site(evidence, out, say=lambda _: None)
    page = text(out / "reproductions" / "r" / "index.html")
    assert "unreadable reproduction.json: $: '" in page and "is a required property" in page
    (out / "stale.html").write_text("old")
    build_site(evidence, out, say=lambda _: None)
    assert not (out / "stale.html").exists() and (out / "index.html").is_file()


# --- the history page, from the record release_history returns -------------------------


def history_record() -> dict[str, Any]:
    def point(tag: str, mean: float | None, invalid: int = 0, ci: Any = 4.5) -> dict[str, Any]:
        return {"tag": tag, "mean": mean, "ci95": ci, "n": 3, "repeats": [], "invalid": invalid}

    def change(
        metric: str, level: int, verdict: str, pct: float | None, direction: str | None = None
    ) -> dict[str, Any]:
        return {
            "metric": metric,
            "server_config": "b",
            "level": level,
            "before_mean": 100.0,
            "after_mean": 120.0,
            "change_pct": pct,
            "p_value": 0.01 if pct else None,
            "p_adjusted": 0.03 if pct else None,
            "verdict": verdict,
            "direction": direction,
            "vs_host_pct": 8.0 if direction else None,
        }

    release = {
        "git_commit": "0123456789abcdef0123",
        "analysis_version": 6,
        "servelab_version": "0.1.0",
        "vllm_version": "0.32.0",
        "points_valid": 10,
        "points_total": 10,
    }
    return {
        "experiment": "exp",
        "releases": [
            {
                **release,
                "tag": "v1",
                "host_class": "AMD EPYC, ISA class avx2",
                "date": "2026-12-01",
            },
            {**release, "tag": "v2", "host_class": "AMD EPYC, ISA class avx2"},
            {
                **release,
                "tag": "v10",
                "host_class": "Intel Xeon, ISA class avx512_bf16+amx",
                "error": "its tarball is missing",
            },
        ],
        "metrics": ["output_throughput", "mean_ttft_ms"],
        "series": [
            {
                "metric": "output_throughput",
                "server_config": "b",
                "level": 8,
                "points": [
                    point("v1", 100.0),
                    point("v2", 120.0),
                    point("v10", None, invalid=3),
                ],
            },
            {
                "metric": "mean_ttft_ms",
                "server_config": "b",
                "level": 8,
                "points": [point("v1", 50.0, 1, [45.0, 55.0]), point("v2", 49.0)],
            },
        ],
        "pairs": [
            {
                "before": "v1",
                "after": "v2",
                "comparable": True,
                "why_not": None,
                "host": None,
                "host_speed": {
                    "recorded": True,
                    "why_not": None,
                    "ratio": 1.1,
                    "low": 1.08,
                    "high": 1.12,
                    "compute": 1.1,
                    "bandwidth": 1.1,
                    "moved": True,
                },
                "fdr": {"method": "Benjamini-Hochberg", "q": 0.05, "tests": 3},
                "points": [
                    change(
                        "output_throughput",
                        8,
                        "changed beyond what the host explains",
                        20.0,
                        "better",
                    ),
                    change("mean_ttft_ms", 8, "unchanged", -2.0),
                    change(
                        "output_throughput",
                        2,
                        "changed as much as the host's speed did (not attributed to the code)",
                        11.5,
                    ),
                    change(
                        "output_throughput",
                        4,
                        "changed beyond what the host explains",
                        -11.5,
                        "worse",
                    ),
                ],
            },
            {
                "before": "v2",
                "after": "v10",
                "comparable": False,
                "why_not": "another vLLM version",
                "host": {
                    "class": "differs",
                    "qualifier": "on a host that differs in: ISA class avx2 -> avx512_bf16+amx",
                },
                "points": [
                    change("output_throughput", 8, "not comparable", None),
                    change("mean_ttft_ms", 8, "invalid", None),
                ],
            },
        ],
    }


def test_history_page_shows_series_and_a_verdict_word_per_point_and_metric() -> None:
    h = history_record()
    figures = {
        "output_throughput": {
            "src": "history/output_throughput.svg",
            "alt": "Output throughput of b at 8 across v1, v2, v10",
        }
    }
    view = history_view.history_view(h, figures, {"v2": ["tables/x.csv: differs"]})
    page = "experiments/exp/history.html"
    html = pages.render(
        "history.html",
        page,
        "History of exp",
        crumbs=[("Evidence", "../../index.html")],
        experiment="exp",
        h=view,
        error=None,
        pages={"v1": "v1/index.html"},
        releases=[],
    )
    words = plain(html)
    assert (
        "v1 2026-12-01 0123456789ab 6 0.1.0 0.32.0 AMD EPYC, ISA class avx2 10/10 verifies" in words
    )
    assert "v2 - 0123456789ab" in words and "does not verify tables/x.csv: differs" in words
    assert "its tarball is missing" in words
    assert "b 8 100.00 ± 4.50 (n 3) 120.00 ± 4.50 (n 3) invalid" in words
    assert "b 8 50.00 [45.00, 55.00] (n 3, 1 invalid) 49.00 ± 4.50 (n 3) -" in words
    assert 'alt="Output throughput of b at 8 across v1, v2, v10"' in html
    # v1 to v2: the verdicts as words (colour is a class beside the word), change, p-value,
    # BH-adjusted p and, beyond the host, the change against the host's
    assert (
        '<span class="verdict v-beyond-better">better, beyond the host</span><br><span '
        'class="ci">+20.00%, p 0.01, BH p 0.03, +8.0% against the host</span>' in html
    )
    assert "b 2 as the host's speed +11.50%, p 0.01, BH p 0.03 -" in words
    assert '<span class="verdict v-beyond-worse">worse, beyond the host</span>' in html
    assert (
        "2 changed beyond what the host explains, 1 changed as much as the host's speed did "
        "(not attributed to the code), 1 unchanged. Benjamini-Hochberg applied: false discovery "
        "rate 5% over the 3 tests of this pair." in words
    )
    assert (
        "Host speed: v2's host ran the canary at 1.10 times the speed of v1's (compute 1.10, "
        "copy bandwidth 1.10; 95% interval 1.08 to 1.12): the host's speed moved." in words
    )
    assert "improved" not in words and "regressed" not in words
    assert (
        "v2 to v10 not comparable another vLLM version No point of this pair is judged: 1 not"
        " comparable. Host: on a host that differs in: ISA class avx2 -> avx512_bf16+amx" in words
    )
    assert '<span class="verdict v-not-comparable">not comparable</span>' in html
    assert 'id="pair-v1-v2"' in html and 'href="#metrics"' in html


def test_history_page_through_the_build(
    tampered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build writes each metric's figure and links it; the history is given the
    releases in tag order, with the build's check of each: the bundle of one that verifies
    still extracted, the failures of one that does not."""
    seen: list[Any] = []

    def release_history(
        experiment: str,
        releases: list[Path],
        workdir: Path,
        checked: dict[Path, CheckedRelease] | None = None,
    ) -> dict[str, Any]:
        seen.append((experiment, [p.name for p in releases]))
        assert checked is not None and set(checked) == set(releases)
        v5, v6 = (checked[p] for p in releases)
        assert v5.failures and not v6.failures
        assert v6.bundle is not None and (v6.bundle / "provenance.json").is_file()
        return history_record()

    api = history_view.HistoryApi(
        release_history,
        lambda h, m: f"<svg>{m}</svg>".encode(),
        lambda h, m: f"{m} across releases",
    )
    monkeypatch.setattr(history_view, "history_api", lambda: api)
    out = tmp_path / "site"
    build_site(tampered, out, say=lambda _: None)
    assert seen == [("quickstart-cpu", ["v5", "v6"])]
    history = out / "experiments" / "quickstart-cpu" / "history.html"
    assert (
        out / "experiments" / "quickstart-cpu" / "history" / "mean_ttft_ms.svg"
    ).read_bytes() == b"<svg>mean_ttft_ms</svg>"
    assert {"output_throughput across releases", "mean_ttft_ms across releases"} == {
        str(i["alt"]) for i in parse(history).imgs
    }
    check_links(out)


def test_history_page_without_the_history_module() -> None:
    html = pages.render(
        "history.html",
        "experiments/exp/history.html",
        "History of exp",
        crumbs=[],
        experiment="exp",
        h=None,
        error="no history",
        pages={},
        releases=[("v1", "v1/index.html")],
    )
    assert '<a href="v1/index.html">v1</a>' in html and "no history" in html


def test_each_release_is_verified_once_per_build(
    tampered: Path, tampered_build: tuple[Path, SiteResult, list[str], list[str]]
) -> None:
    """The history reads the bundles the release pages' checks extracted: every release
    folder is checked (evidence.verify.check_release_folder) once, the one that does not
    verify too, and that one is in the history as not verifying, its pair not comparable."""
    out, _, _, checked = tampered_build
    assert sorted(checked) == ["v5", "v6"]
    history = text(out / "experiments" / "quickstart-cpu" / "history.html")
    assert (
        "v5 cannot be analysed again by this servelab: "
        f"{tampered.name}/quickstart-cpu/v5: release does not verify: tables/claims.json: differs "
        "from the copy inside v5.tar.gz (and 1 more)"
    ) in history
    assert "does not verify tables/claims.json: differs from the copy inside v5.tar.gz" in history
    assert "v5 to v6 not comparable v5 cannot be analysed again" in history
    assert str(out.parent) not in history and str(tampered) not in history  # no absolute path


def test_committed_history_attributes_no_change_to_the_code(
    committed: tuple[Path, SiteResult, list[str]],
) -> None:
    """The committed releases record no host-speed canary: v4 to v5 (8 points under alpha
    0.05 alone, a slower shared VM) and v7 to v8 (a faster one) say what they cannot
    attribute, under Benjamini-Hochberg, and never call a point improved or regressed."""
    out, _, _ = committed
    words = text(out / "experiments" / "quickstart-cpu" / "history.html")
    not_recorded = (
        "Host speed: not recorded (neither {0} nor {1} measured the canary): a change between "
        "these releases may be the host's speed as well as the code's, and is not attributed "
        "to the code."
    )
    assert (
        not_recorded.format("v4", "v5") + " 2 changed with the host speed not recorded (not "
        "attributed to the code), 28 unchanged. Benjamini-Hochberg applied: false discovery "
        "rate 5% over the 30 tests of this pair." in words
    )
    assert (
        not_recorded.format("v7", "v8") + " 22 changed with the host speed not recorded (not "
        "attributed to the code), 8 unchanged. Benjamini-Hochberg applied: false discovery "
        "rate 5% over the 30 tests of this pair." in words
    )
    assert "changed, host speed not recorded" in words
    for word in ("improved", "regressed", "better, beyond the host", "worse, beyond the host"):
        assert words.count(word) == (1 if "beyond" in word else 0), word  # the legend's only
