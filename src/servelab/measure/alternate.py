"""Points sent in slices that alternate between servers kept up together
(`sweep.repeats.slices`, with side_by_side).

A side-by-side round measures the points a comparison pairs seconds apart, yet the host's speed
drifts over a point's own length: on a 2-core VM beside hypervisor steal, the two halves of one
point differ by about as much as two servers' points measured one after the other
(benchmarks/README.md, "Slices"). Sending each point of the pair in slices, A B then B A
(A B B A A B ...), puts both sides' slices through the same stretches of the host's drift, so
that it cancels from their ratio instead of adding to its spread.

Each point keeps its slices' windows (point.json `slices`); its duration and throughput are over
them alone (servelab.metrics.sliced), and its telemetry reads the other servers' CPU as theirs
(servelab.telemetry.sources.HostSource `siblings`), not as contention.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servelab.design.schedule import in_turn
from servelab.measure.point import OpenPoint


def bounds(n: int, slices: int) -> list[tuple[int, int]]:
    """A point's n items in `slices` contiguous parts [lo, hi), as even as it goes, the larger
    parts first."""
    out, lo = [], 0
    for k in range(slices):
        size = n // slices + (k < n % slices)
        out.append((lo, lo + size))
        lo += size
    return [(a, b) for a, b in out if b > a]


def alternate(
    points: Sequence[OpenPoint], slices: int, progress: str
) -> list[Mapping[str, object]]:
    """Measure `points` (one per server, of one level) in `slices` slices each, taking turns
    (design.schedule.in_turn: A B, then B A, ...); every point complete, or, where a stop
    signal or a failure cuts the pair short (a server that died, found as each point closes),
    every one not yet complete kept as incomplete. Their point.json documents."""
    parts = [(p, bounds(p.job.requests(p.slot), slices)) for p in points]
    started: list[OpenPoint] = []
    try:
        for p in points:
            started.append(p)
            p.start()
        for k in range(max(len(b) for _, b in parts)):
            for p, mine in in_turn(parts, k + 1):
                if k < len(mine):
                    p.send(mine[k])
    except BaseException as exc:
        for p in started:
            p.interrupted(exc)
        raise
    docs: list[Mapping[str, object]] = []
    for i, p in enumerate(points):
        try:
            docs.append(p.close(progress))
        except BaseException as exc:  # a server that died: the points after it kept too
            for rest in points[i + 1 :]:
                rest.interrupted(exc)
            raise
    return docs
