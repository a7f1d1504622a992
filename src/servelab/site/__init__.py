"""`servelab site`: one static, self-contained site over a folder of releases and
reproductions (docs/site.md). HTML, one stylesheet and SVG figures, every link relative: it
opens from file:// and from any static host, with no script and nothing fetched.

Modules: `scan` finds the experiments, releases and reproductions; `check` verifies each
release; `release_view`, `reproduction_view` and `history_view` turn their records into the
pages' contexts (a release page's typed in `release_records`); `pages` renders the templates;
`layout` names every page and link; `build` writes the site; `history` reads every release of
an experiment into its history, whose record `history_records` types.
"""

from servelab.site.build import SiteResult, build_site

__all__ = ["SiteResult", "build_site"]
