"""The records of profile.json, typed: the whole profile (`ProfileRecord`), a window's entry
(`WindowEntry`) and the rows inside it, the ratios and localisation verdicts between windows,
the analysis settings and the trace's facts. Written by servelab.profile.trace_analysis (and
the modules it calls), read by servelab.profile.rendering. Then what capture.json keeps of a
capture (servelab.profile.capture): its points, its progress and the nsys report.

Keys that are Python keywords (`from`) make some records use TypedDict's functional form.
Fields added within format 2 (see trace_analysis.PROFILE_FORMAT_VERSION) are NotRequired:
a reader may meet a profile.json written before them.
"""

from __future__ import annotations

from typing import TypedDict

from servelab.documents.declared import (
    FamilyRow,
    NsysReport,
)


def us_per_token(family: FamilyRow | None) -> float | None:
    """A family row's µs per output token; None for a family the window does not list."""
    return family.get("us_per_token") if family is not None else None


class KernelRow(TypedDict):
    """A kernel (or kernel family, nsys) in a window: kernels.csv's rows."""

    kernel: str
    family: str
    instantiations: int
    calls: int
    total_us: float


class GridPathRow(TypedDict):
    """A launch grid's time in a window (kernels.paths_table)."""

    path: str
    grid: list[int] | None
    calls: int
    total_us: float
    us_per_token: float | None
    mean_us: float | None


"""The steady state's ratios from a window to the next (ProfileRecord.ratios)."""


"""The localisation verdict between two consecutive windows (ProfileRecord.localisation)."""


# --- capture.json ---------------------------------------------------------------------------


class PointRow(TypedDict):
    """One diagnostic point as capture.json's `points` lists it."""

    label: str
    concurrency: int
    requests: int
    failed: int
    output_tokens: int
    duration_s: float
    trace_write_s: float


class Progress(TypedDict, total=False):
    """What capture.json keeps of a capture, also when it fails: the launch (how the profiler
    is driven, its command and environment, its start and lock), the points captured so far
    and the nsys report (and how long the job waited for it)."""

    interface: str
    command: list[str]
    env: dict[str, str]
    ready_s: float
    start: dict[str, object]
    lock: dict[str, object]
    points: list[PointRow]
    nsys_report: NsysReport
    report_wait_s: float
