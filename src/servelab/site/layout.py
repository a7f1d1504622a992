"""Where each page and file of the site goes, and the relative links between them.

Every path here is relative to the site's folder, in POSIX form; every link is relative to the
page it is written on, so the site works from file:// and from any static host.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import quote

INDEX = "index.html"
STYLE = "style.css"
# written last: a folder holding it is a site `servelab site` may rebuild in place
MARKER = ".servelab-site"


def release_page(experiment: str, tag: str) -> str:
    return f"experiments/{experiment}/{tag}/index.html"


def release_files(experiment: str, tag: str) -> str:
    """The copy of the release folder, file for file."""
    return f"experiments/{experiment}/{tag}/files"


def release_bundle(experiment: str, tag: str) -> str:
    """Files taken from inside the release's tarball (its profile summaries)."""
    return f"experiments/{experiment}/{tag}/bundle"


def history_page(experiment: str) -> str:
    return f"experiments/{experiment}/history.html"


def history_figure(experiment: str, metric: str) -> str:
    return f"experiments/{experiment}/history/{file_name(metric)}.svg"


def reproduction_page(name: str) -> str:
    return f"reproductions/{name}/index.html"


def reproduction_files(name: str) -> str:
    return f"reproductions/{name}/files"


def file_name(text: str) -> str:
    """`text` as a file name: letters, digits, '.', '_' and '-' kept, anything else '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def anchor(text: str) -> str:
    """An id for `text`: lower case, runs of other characters as one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def root(page: str) -> str:
    """The way from `page` back to the site's folder ("" for a page at the top)."""
    return "../" * page.count("/")


def href(page: str, target: str, fragment: str = "") -> str:
    """The link from `page` to `target` (both site paths), percent-encoded, with an optional
    #fragment."""
    rel = posixpath.relpath(target, posixpath.dirname(page) or ".")
    return quote(rel) + (f"#{fragment}" if fragment else "")
