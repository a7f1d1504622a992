"""The site's templates (templates/*.html, autoescaped) and its one stylesheet."""

from __future__ import annotations

from functools import cache
from importlib import resources

import jinja2

from servelab.site import layout, values


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("servelab.site", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["value_text"] = values.value_text
    return env


def render(template: str, page: str, title: str, **context: object) -> str:
    """The page `page` (a site path) from `template`: its title, the way back to the site's
    folder for its links, and the context its template reads."""
    return (
        environment()
        .get_template(template)
        .render(page=page, root=layout.root(page), title=title, **context)
    )


def stylesheet() -> bytes:
    return resources.files("servelab.site").joinpath("templates", layout.STYLE).read_bytes()
