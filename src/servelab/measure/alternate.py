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

from collections.abc import Sequence

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


def order(points: Sequence[OpenPoint], k: int) -> list[OpenPoint]:
    """Who sends slice k: as listed for even k, reversed for odd k (A B, B A, A B, ...)."""
    return list(points) if k % 2 == 0 else list(points)[::-1]


def alternate(points: Sequence[OpenPoint], slices: int, progress: str) -> list[object]:
    """Measure `points` (one per server, started, of one level) in `slices` slices each, in
    turn (`order`); every point complete, or, where a stop signal or a failure cuts the pair
    short (a server that died, found as each point closes), every one not yet complete kept
    as incomplete. Their point.json documents."""
    parts = [bounds(p.job.requests(p.slot), slices) for p in points]
    started: list[OpenPoint] = []
    try:
        for p in points:
            started.append(p)
            p.start()
        for k in range(max(len(b) for b in parts)):
            for p in order(points, k):
                mine = parts[points.index(p)]
                if k < len(mine):
                    p.send(mine[k])
    except BaseException as exc:
        for p in started:
            p.interrupted(exc)
        raise
    docs: list[object] = []
    for i, p in enumerate(points):
        try:
            docs.append(p.close(progress))
        except BaseException as exc:  # a server that died: the points after it kept too
            for rest in points[i + 1 :]:
                rest.interrupted(exc)
            raise
    return docs
