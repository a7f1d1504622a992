"""A release page's context (`site.release_view.release_context`) and the release's row of the
index: every section's rows as the templates read them (templates/release.html, index.html);
a section that could not be read holds its `error`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict


class CopiedFile(TypedDict):
    """A file copied beside its page: its path in the release (or reproduction) folder, its
    size and, on the page, its link."""

    path: str
    bytes: int
    href: NotRequired[str]


class ClaimRow(TypedDict):
    claim: str
    verdict: str
    css: str
    reason: str | None
    line: str | None
    evidence: Any


class ClaimsSection(TypedDict):
    """The claims section (tables/claims.json); `error` where it could not be read."""

    rows: list[ClaimRow]
    held: int
    total: int
    error: NotRequired[str | None]


class PointCell(TypedDict):
    mean: str
    ci: str
    n: str


class PointRow(TypedDict):
    level: str
    cells: list[PointCell | None]


class PointTable(TypedDict):
    server_config: str
    id: str
    rows: list[PointRow]


class PerPoint(TypedDict):
    """The per-point section (tables/summary.csv): a table per server configuration."""

    axis: str
    metrics: list[str]
    tables: list[PointTable]
    error: NotRequired[str | None]


class CheckRow(TypedDict):
    name: str
    threshold: str
    removes: str
    counts: list[int]


class ValiditySection(TypedDict):
    """The validity section: points valid/total (None when not recorded), each check, each
    flagged point."""

    valid: int | None
    total: int | None
    checks: list[CheckRow]
    flagged: list[dict[str, str]]
    error: NotRequired[str | None]
    axis: NotRequired[str]


class DiagnosisRow(TypedDict):
    kind: str
    server_config: str
    where: str | None
    level: str | None
    suggestion: str
    proposal: str | None
    evidence: Any


class DiagnosesSection(TypedDict):
    rows: list[DiagnosisRow]
    error: NotRequired[str | None]


class ProfileRow(TypedDict):
    """A profiled server configuration's summary; its files' links once copied."""

    server_config: str
    status: str
    tool: str | None
    reason: str | None
    localisation: list[str]
    notes: list[str]
    markdown: NotRequired[str | None]
    json: NotRequired[str | None]
    id: NotRequired[str]


class ProfilesSection(TypedDict):
    error: str | None
    rows: list[ProfileRow]


class ReleaseRow(TypedDict):
    """A release in the index; its page's links once written."""

    tag: str
    date: str
    host: str
    commit: str
    servelab: str
    vllm: str
    claims: str
    points: str
    failures: list[str]
    href: NotRequired[str]
    href_failures: NotRequired[str]


class Tarball(TypedDict):
    name: str
    href: str
    sha256: str


class ReleaseContext(TypedDict):
    """The release page's context (templates/release.html), and its row of the index."""

    experiment: str
    tag: str
    toc: Sequence[tuple[str, str]]
    failures: list[str]
    summary: list[tuple[str, str]]
    claims: ClaimsSection
    points: PerPoint
    validity: ValiditySection
    diagnoses: DiagnosesSection
    figures: list[dict[str, str]]
    host: list[tuple[str, str]]
    provenance: list[tuple[str, str]]
    host_error: str | None
    links: dict[str, str | None]
    files: list[CopiedFile]
    row: ReleaseRow
    tarball: NotRequired[Tarball | None]
    profiles: NotRequired[ProfilesSection]
