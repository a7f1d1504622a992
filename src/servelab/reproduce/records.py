"""reproduction.json: the record a comparison writes (comparison.compare_sides), which the
report (markdown), the printed verdict (verdict) and the site's reproduction page read. Its
rows are typed beside their writers: the checks' in `checks`, the provenance diff's in
`provenance_diff`, a side's in `sides`."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from servelab.analysis.hostspeed import Gate, HostRatio, gate_reason
from servelab.hostfacts.compare import HostComparison
from servelab.reproduce.checks import ChainRow, ClaimCheck, PairCheck, PointCheck
from servelab.reproduce.provenance_diff import ProvenanceDiff
from servelab.reproduce.sides import SideFacts


class HostSpeedRecord(TypedDict):
    """`host_speed`: whether the fresh host's speed over the reference's is recorded, why not,
    and where it is, the ratio with its band and parts (analysis.hostspeed.HostRatio)."""

    recorded: bool
    why_not: str | None
    ratio: NotRequired[float]
    low: NotRequired[float]
    high: NotRequired[float]
    compute: NotRequired[float]
    bandwidth: NotRequired[float]
    moved: NotRequired[bool]
    # "gpu" where compute and bandwidth are the GPU canary's matmul and device copy (both runs
    # timed it on the same work); absent where they are the CPU canary's
    parts: NotRequired[str]
    # the worst canary drift of either run (absent where none is recorded), the CPU canary's
    # ratio and interval beside a GPU one, the margin of the gate, why the canary cannot tell
    # before any point is read (None: it may), and the rerun an UNKNOWN names
    drift: NotRequired[str]
    cpu: NotRequired[list[float]]
    margin_pct: NotRequired[float]
    unknown_why: NotRequired[str | None]
    rerun: NotRequired[str]


def host_speed_json(
    ratio: HostRatio | None, why: str | None, gate: Gate | None = None
) -> HostSpeedRecord:
    """A `host_speed` record (a comparison's, a history pair's): the ratio with its interval
    and parts as HostRatio.to_json writes them, the gate's margin, reason and rerun command
    (`gate`), or why there is none."""
    out: HostSpeedRecord = {"recorded": ratio is not None, "why_not": why}
    if ratio is not None:
        out["ratio"], out["low"], out["high"] = ratio.ratio, ratio.low, ratio.high
        out["compute"], out["bandwidth"] = ratio.compute, ratio.bandwidth
        out["moved"] = ratio.moved
        if ratio.parts != "cpu":
            out["parts"] = ratio.parts
        if ratio.drift:
            out["drift"] = ratio.drift
        if ratio.cpu is not None:
            out["cpu"] = list(ratio.cpu)
        if gate is not None:
            out["margin_pct"] = gate.margin_pct
            out["unknown_why"] = gate_reason(ratio, gate)
            out["rerun"] = gate.rerun
    return out


class Fdr(TypedDict):
    """`fdr`: the false discovery control over the point tests."""

    method: str
    q: float
    tests: int


class Settings(TypedDict):
    """`settings`: how strictly the fresh run had to match (the reproduction section) and the
    reference's analysis thresholds; `axis` "rate" for sweeps over request rates."""

    metrics: list[str]
    min_effect_pct: float
    require_significance: bool
    tolerance_pct: float | None
    tolerance_metrics: list[str]
    threshold_pct: float
    alpha: float
    axis: NotRequired[str]


class Counts(TypedDict):
    """`counts`: how many checks were judged, and how many of each verdict."""

    checks: int
    reproduced: int
    not_reproduced: int
    not_comparable: int


class ReproductionRecord(TypedDict):
    """reproduction.json. `verdict_text`, `host`, `host_speed` and `fdr` are absent in
    reproductions made before they were recorded (their readers say so)."""

    format_version: int
    verdict: str
    verdict_text: NotRequired[str]
    why: str
    host: NotRequired[HostComparison]
    host_speed: NotRequired[HostSpeedRecord]
    fdr: NotRequired[Fdr]
    reference: SideFacts
    fresh: SideFacts
    settings: Settings
    notes: list[str]
    claims: list[ClaimCheck]
    orderings: list[PairCheck]
    chains: list[ChainRow]
    paired: list[PairCheck]
    points: list[PointCheck]
    provenance: ProvenanceDiff
    counts: Counts
