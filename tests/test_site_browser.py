"""The evidence site in a real browser: `servelab site evidence --out DIR` over the committed
releases, then headless Chromium (tests/chromium_cdp.py) loads the index, follows every link
between the site's pages, and checks that every page and figure loads with no console error,
that nothing is wider than a 360 px screen, and that the pages read the same with scripts off.
It saves screenshots of the index, a release page and the history page (docs/site.md shows
them: SERVELAB_SITE_SCREENSHOTS=docs/site writes them there too).

Runs wherever Chromium is installed (Debian's `chromium`); skipped otherwise, except that
.ci/run installs it and sets SERVELAB_REQUIRE_CHROMIUM=1, which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest
from chromium_cdp import Page, chromium, chromium_binary

REPO = Path(__file__).resolve().parents[1]


def _binary() -> str:
    found = chromium_binary()
    if found is None:
        why = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("SERVELAB_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"SERVELAB_REQUIRE_CHROMIUM=1 but {why}")
        pytest.skip(why)
    return found


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Path:
    """`servelab site evidence`: the site of the committed releases, built once per test run
    (tests/release_fixtures.py; test_site.py reads the same site), asked for only once Chromium
    is known to be here (skipped, or failed, before anything is built). `python -m
    servelab.cli` is the `servelab` command: it runs as a program of its own."""
    _binary()
    proc = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "site", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0 and "--out" in proc.stdout, proc.stdout + proc.stderr
    out: Path = request.getfixturevalue("committed_site").out
    assert (out / "index.html").is_file()
    return out


async def _links(page: Page) -> list[str]:
    hrefs = await page.evaluate("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    return [str(h) for h in hrefs]


async def _images_broken(page: Page) -> list[str]:
    """The figures that did not load. The site's figures load lazily (loading="lazy": only as
    they scroll into view), so each is asked to load now, and given up to 10 s."""
    await page.evaluate("Array.from(document.images).forEach(i => { i.loading = 'eager'; })")
    pending = "Array.from(document.images).filter(i => !i.complete).length"
    for _ in range(100):
        if not await page.evaluate(pending):
            break
        await asyncio.sleep(0.1)
    broken = await page.evaluate(
        "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.src)"
    )
    return [str(b) for b in broken]


async def _crawl(binary: str, root: Path, shots: Path) -> dict[str, list[str]]:
    """Every page reachable from index.html by links inside the site: its problems (empty
    when it loaded cleanly). Screenshots of the index, the latest release's page and the
    history page go to `shots`."""
    seen: dict[str, list[str]] = {}
    start = (root / "index.html").as_uri()
    todo = [start]
    release_page: str | None = None
    history_page: str | None = None
    async with chromium(binary) as page:
        while todo:
            url = todo.pop(0)
            if url in seen:
                continue
            load = await page.load(url)
            problems = load.problems
            problems += [f"figure did not load: {src}" for src in await _images_broken(page)]
            if not load.title.strip():
                problems.append("no <title>")
            for href in await _links(page):
                target, _ = urldefrag(href)
                parsed = urlparse(target)
                if parsed.scheme != "file":
                    problems.append(f"links outside the site: {href}")
                    continue
                path = Path(parsed.path)
                if not path.is_relative_to(root):
                    problems.append(f"links outside the site: {href}")
                elif not path.exists():
                    problems.append(f"broken link: {href}")
                elif path.suffix == ".html" and target not in seen:
                    todo.append(target)
                    name = path.relative_to(root).as_posix()
                    if history_page is None and "history" in name:
                        history_page = target
                    elif url == start and re.fullmatch(r"experiments/[^/]+/v\d+/index.html", name):
                        release_page = target  # the index lists releases in tag order: the last
            seen[url] = problems
        assert release_page is not None, "no release page is linked from the site"
        assert history_page is not None, "no history page is linked from the site"
        pages = {"index": start, "release": release_page, "history": history_page}
        for name, url in pages.items():
            await page.load(url)
            await page.screenshot(shots / f"{name}.png", 1280, 1000)
            # a narrow screen: nothing wider than the viewport (tables scroll in their box)
            await page.screenshot(shots / f"{name}-narrow.png", 360, 800)
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                width=360,
                height=800,
                deviceScaleFactor=1,
                mobile=True,
            )
            wide = await page.evaluate(
                "document.documentElement.scrollWidth > document.documentElement.clientWidth + 1"
            )
            await page.send("Emulation.clearDeviceMetricsOverride")
            seen[url] = seen.get(url, []) + (
                [f"wider than a 360 px screen ({name})"] if wide else []
            )
        # without scripts the pages read the same: their text does not come from JavaScript
        await page.send("Emulation.setScriptExecutionDisabled", value=True)
        for url in pages.values():
            await page.load(url)
            text = str(await page.evaluate("document.body.innerText"))
            if len(text) < 200:
                seen[url].append(f"only {len(text)} characters of text with scripts off")
    return seen


def _not_blank(png: Path) -> bool:
    from matplotlib import image

    pixels = image.imread(png)
    return bool(pixels.std() > 0.01)


def test_the_site_loads_in_chromium(site: Path, tmp_path: Path) -> None:
    binary = _binary()
    shots = tmp_path / "screenshots"
    seen = asyncio.run(_crawl(binary, site, shots))
    releases = [u for u in seen if "/quickstart-cpu/" in u]
    assert len(releases) >= 7, sorted(seen)
    bad = {u: p for u, p in seen.items() if p}
    assert not bad, bad
    for png in sorted(shots.glob("*.png")):
        assert _not_blank(png), f"{png.name} is blank"
    assert {p.stem for p in shots.glob("*.png")} >= {"index", "release", "history"}
    keep = os.environ.get("SERVELAB_SITE_SCREENSHOTS")
    if keep:
        dest = REPO / keep if not Path(keep).is_absolute() else Path(keep)
        dest.mkdir(parents=True, exist_ok=True)
        for png in sorted(shots.glob("*.png")):
            shutil.copyfile(png, dest / png.name)
