"""What every point sends: how many requests (`requests_of`) and, at a request rate, on which
schedule (`schedule_of`: the sweep's arrival process, or a trace's timestamps); and a trace
replay's points (workload.trace, servelab.workload.trace): what one launch replays (`Replay`:
the window, filtered to its server), each rate's send schedule and what a point records of
the trace.

A trace point's level is a request rate (sweep.rate): its time scale is the window's recorded
rate over the level, so every rate replays the same requests, k times faster at k times the
recorded rate. Every point of a launch replays the whole window (its own copy of the blocks:
servelab.workload.promptset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.design.arrivals import ArrivalProcess, schedule_sha256, scheduled_rate
from servelab.design.schedule import Slot
from servelab.experiment import ArrivalSection, Experiment
from servelab.store.jsonio import clean
from servelab.store.records import ArrivalsRecord
from servelab.workload.trace import Window, intended_reuse, schedule_ns


@dataclass(frozen=True)
class Replay:
    """The trace window one launch replays: `window` (filtered to the server), `sha256` (the
    file's) and `block_tokens`."""

    window: Window
    sha256: str
    block_tokens: int

    @property
    def requests(self) -> int:
        """The requests every point sends: the window's, less those left out."""
        return len(self.window.rows)

    def schedule(self, rate: float, seed: int, max_in_flight: int | None) -> ArrivalsRecord:
        """The send schedule of a rate's points: the window's timestamps x its time scale."""
        scale = self.window.time_scale(rate)
        offsets = schedule_ns(self.window, scale)
        return ArrivalsRecord.new(
            clean(
                {
                    "process": "trace",
                    "rate": rate,
                    "burstiness": 1,
                    "seed": seed,
                    "max_in_flight": max_in_flight,
                    "requests": len(offsets),
                    "scheduled_rate": scheduled_rate(offsets),
                    "schedule_sha256": schedule_sha256(offsets),
                    "time_scale": round(scale, 9),
                    "offsets_ns": offsets,
                }
            )
        )

    def point_block(self, rate: float) -> dict[str, Any]:
        """point.json `trace`: the file, the window replayed, the time scale and the reuse the
        trace implies over the point's requests (from an empty cache)."""
        return {
            "sha256": self.sha256,
            "time_scale": round(self.window.time_scale(rate), 9),
            "window": self.window.record(),
            "reuse": intended_reuse(self.window.rows, self.block_tokens),
        }


def requests_of(exp: Experiment, slot: Slot) -> int:
    """The requests a point sends: concurrency x workload.waves, or a rate's
    ceil(rate x sweep.arrival.duration_s)."""
    if slot.level.is_rate:
        assert exp.sweep.arrival is not None
        return exp.sweep.arrival.requests(slot.level.value)
    return int(slot.level.value) * exp.workload.waves


def schedule_of(
    arrival: ArrivalSection, rate: float, seed: int, replay: Replay | None = None
) -> ArrivalsRecord:
    """The send schedule of a rate's points: an arrival section's process at `rate` (sweep's,
    or the SLO search's), drawn from `seed`, workload.seed: the same for every repeat,
    configuration and reproduction; a trace's timestamps at the rate's time scale."""
    if replay is not None:
        return replay.schedule(rate, seed, arrival.max_in_flight)
    process = ArrivalProcess(arrival.process, rate, arrival.burstiness, seed)
    return ArrivalsRecord.of(process, arrival.requests(rate), arrival.max_in_flight)
