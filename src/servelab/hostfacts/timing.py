"""What the host-speed canaries (hostfacts.canary: the CPU's; hostfacts.gpucanary: the GPU's)
share: a part's k repeats as a `Timing` (median, min and max), and the drift rule that tells a
part that moved between two timings beyond its own noise (`part_drift`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from servelab.documents.declared import PartDriftJson, TimingJson

DRIFT_FLOOR = 0.05
NOISE_FACTOR = 3.0
# a part whose own repeats spread wider than this ((max - min) / median) says the host's speed
# varied while the canary ran: its drift cannot be judged ("unsteady"), and that is itself noted
UNSTEADY_SPREAD = 0.25
VERDICTS = ("steady", "moved", "unsteady")


@dataclass(frozen=True)
class Timing:
    """k repeats of one part: median, min and max, in ``unit``; `timings` every repeat in the
    order taken (None in records written before they were kept: the cross-run host ratio then
    reads (low, median, high), analysis.hostspeed)."""

    unit: str
    median: float
    low: float
    high: float
    repeats: int
    timings: tuple[float, ...] | None = None

    @property
    def relative_spread(self) -> float:
        """(max - min) / median: the part's own noise."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def to_json(self) -> TimingJson:
        out: TimingJson = {
            "unit": self.unit,
            "median": self.median,
            "low": self.low,
            "high": self.high,
            "repeats": self.repeats,
        }
        if self.timings is not None:
            out["timings"] = list(self.timings)
        return out

    @classmethod
    def from_json(cls, doc: TimingJson) -> Timing:
        kept = doc.get("timings")
        return cls(
            str(doc["unit"]),
            float(doc["median"]),
            float(doc["low"]),
            float(doc["high"]),
            int(doc["repeats"]),
            None if kept is None else tuple(float(x) for x in kept),
        )


def summary(values: list[float], unit: str) -> Timing:
    """The Timing of `values` (one per repeat, kept in `timings`)."""
    return Timing(
        unit, statistics.median(values), min(values), max(values), len(values), tuple(values)
    )


@dataclass(frozen=True)
class PartDrift:
    """One part's relative change (positive: the host got slower) and its verdict: moved
    (beyond `threshold`), else unsteady (its own repeats spread beyond UNSTEADY_SPREAD before
    or after: too noisy to call steady), else steady."""

    change: float
    threshold: float
    verdict: str

    def to_json(self) -> PartDriftJson:
        return {"change": self.change, "threshold": self.threshold, "verdict": self.verdict}

    @classmethod
    def from_json(cls, doc: PartDriftJson) -> PartDrift:
        return cls(float(doc["change"]), float(doc["threshold"]), str(doc["verdict"]))


def part_drift(
    before: Timing, after: Timing, slower_when_higher: bool, floor: float = DRIFT_FLOOR
) -> PartDrift:
    """A part moved when its change exceeds the larger of NOISE_FACTOR x the mean relative
    spread of the two timings and ``floor``; short of that, it is unsteady when either timing's
    own spread exceeds UNSTEADY_SPREAD, else steady. `slower_when_higher`: seconds (a higher
    value is slower), else a rate (a higher value is faster)."""
    ratio = after.median / before.median if before.median else 1.0
    change = ratio - 1.0 if slower_when_higher else 1.0 / ratio - 1.0
    threshold = max(NOISE_FACTOR * (before.relative_spread + after.relative_spread) / 2, floor)
    if abs(change) > threshold:
        return PartDrift(change, threshold, "moved")
    unsteady = max(before.relative_spread, after.relative_spread) > UNSTEADY_SPREAD
    return PartDrift(change, threshold, "unsteady" if unsteady else "steady")


def overall(*parts: PartDrift) -> str:
    """The canary moved when a part moved, else is unsteady when a part is, else steady."""
    verdicts = {p.verdict for p in parts}
    return next((v for v in ("moved", "unsteady") if v in verdicts), "steady")


def drift_line(named: Mapping[str, PartDrift], verdict: str) -> str:
    """steady (compute +1.2%, copy -3.0%; beyond 5.0% and 7.5% it moved), or unsteady (...)
    when a part's repeats spread too wide to judge: the parts by their names."""
    changes = ", ".join(f"{name} {p.change:+.1%}" for name, p in named.items())
    said = f"{verdict} ({changes}; "
    if verdict == "unsteady":
        which = " and ".join(n for n, p in named.items() if p.verdict == "unsteady")
        return said + f"{which} varied by more than {UNSTEADY_SPREAD:.0%} within a timing)"
    thresholds = " and ".join(f"{p.threshold:.1%}" for p in named.values())
    return said + f"beyond {thresholds} it moved)"
