"""Forwards and the steady state: launches of the main attention kernel (once per layer per
forward) grouped into forwards, the longest steady run of forwards, and the ratios between
windows.

The layer count comes from the model's config.json (or --layers); the population dimension of
the attention grid and the alignment of forwards are found from the launches themselves.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from servelab.documents.declared import RatioRow, Steady
from servelab.errors import ServelabError
from servelab.store.jsonio import read_json

DIMS = ("x", "y", "z")  # grid dimensions
PREFIX_FORWARDS = 64  # forwards buffered per (window, device) to find the alignment


class Launch(NamedTuple):
    """One launch of the main attention kernel (once per layer per forward).

    `tag` is equal for every launch of one forward when the trace is consistent: the value of
    the population dimension of the grid, or the engine step that encloses the launch. `key`
    names the launch's code path before the batch-dependent dimensions are masked: its full
    grid (GPU; with the kernel's instantiation label appended when the main attention kernel
    has several), or the kind of its engine step (CPU). `origin` identifies the host call that
    launched it (nsys: globalPid and correlationId), or None.
    """

    start_ns: int
    end_ns: int
    population: int | None
    tag: object
    key: object = None
    origin: object = None


@dataclass(frozen=True)
class Forward:
    index: int
    start_ns: int
    end_ns: int
    population: int | None
    kernel_ns: int
    consistent: bool
    key: object = None  # the launches' common key (grid or step kind); None when they differ
    origin: object = None  # the first launch's origin (see Launch)


class ForwardGrouper:
    """Groups consecutive launches into forwards of `layers` launches, streaming.

    The first launches of a window may belong to a forward that began before it; the alignment
    (how many launches to skip) is the one with the fewest inconsistent forwards over the
    first PREFIX_FORWARDS forwards. Only that prefix is buffered.
    """

    def __init__(self, layers: int) -> None:
        if layers < 1:
            raise ServelabError(f"layer count {layers} must be at least 1")
        self.layers = layers
        self._buffer: list[Launch] | None = []
        self._current: list[Launch] = []
        self.offset = 0
        self.launches = 0
        self.forwards: list[Forward] = []

    def feed(self, launch: Launch) -> None:
        self.launches += 1
        if self._buffer is not None:
            self._buffer.append(launch)
            if len(self._buffer) >= self.layers * (PREFIX_FORWARDS + 1):
                self._settle()
            return
        self._push(launch)

    def feed_columns(
        self,
        starts: Sequence[int],
        ends: Sequence[int],
        pops: Sequence[int | None],
        tags: Sequence[object],
        grids: Sequence[Sequence[object]] | None = None,
        origins: Sequence[object] | None = None,
    ) -> None:
        """`feed` for many launches at once, given as columns (launch i is starts[i], ends[i],
        pops[i], tags[i], key (grids[0][i], grids[1][i], ...), origin origins[i]): the same
        forwards, with the work done per forward, not per launch.
        """
        n = len(starts)

        def key(j: int) -> object:
            return None if grids is None else tuple(c[j] for c in grids)

        def origin(j: int) -> object:
            return None if origins is None else origins[j]

        def launch(j: int) -> Launch:
            return Launch(starts[j], ends[j], pops[j], tags[j], key(j), origin(j))

        i = 0
        while self._buffer is not None and i < n:  # the prefix that finds the alignment
            self.feed(launch(i))
            i += 1
        while self._current and i < n:  # the rest of a forward begun in an earlier batch
            self.launches += 1
            self._push(launch(i))
            i += 1
        if i == n:
            return
        L = self.layers
        whole = i + (n - i) // L * L
        self.launches += n - i
        forwards = self.forwards
        for a in range(i, whole, L):
            b = a + L
            consistent = len(set(tags[a:b])) == 1
            ps = pops[a:b]
            es = ends[a:b]
            # the forward's key: its grid when every layer has the same (per column, in C)
            k = None
            if grids is not None and all(c[a:b].count(c[a]) == L for c in grids):
                k = key(a)
            forwards.append(
                Forward(
                    index=len(forwards),
                    start_ns=starts[a],
                    end_ns=max(es),
                    population=ps[0] if consistent and len(set(ps)) == 1 else None,
                    kernel_ns=sum(es) - sum(starts[a:b]),
                    consistent=consistent,
                    key=k,
                    origin=origin(a),
                )
            )
        self._current = [launch(j) for j in range(whole, n)]

    def _settle(self) -> None:
        buf = self._buffer or []
        self._buffer = None
        L = self.layers
        best = 0
        best_bad = math.inf
        for off in range(min(L, max(len(buf), 1))):
            groups = [buf[i : i + L] for i in range(off, len(buf) - L + 1, L)]
            bad = sum(1 for g in groups if len({x.tag for x in g}) > 1)
            if bad < best_bad:
                best, best_bad = off, bad
        self.offset = best
        for launch in buf[best:]:
            self._push(launch)

    def _push(self, launch: Launch) -> None:
        self._current.append(launch)
        if len(self._current) == self.layers:
            g = self._current
            self._current = []
            consistent = len({x.tag for x in g}) == 1
            pops = {x.population for x in g}
            pop = g[0].population if consistent and len(pops) == 1 else None
            keys = {x.key for x in g}
            self.forwards.append(
                Forward(
                    index=len(self.forwards),
                    start_ns=g[0].start_ns,
                    end_ns=max(x.end_ns for x in g),
                    population=pop,
                    kernel_ns=sum(x.end_ns - x.start_ns for x in g),
                    consistent=consistent,
                    key=g[0].key if len(keys) == 1 else None,
                    origin=g[0].origin,
                )
            )

    def finish(self) -> ForwardGrouper:
        if self._buffer is not None:
            self._settle()
        self._current = []  # a trailing partial forward is cut by the window end
        return self

    @property
    def violations(self) -> int:
        return sum(1 for f in self.forwards if not f.consistent)


def choose_dim(distinct: Sequence[set[int]], violations: Sequence[int]) -> int | None:
    """The grid dimension that carries the population: one that varies across launches, with
    the fewest forwards whose layers disagree on it, then the most distinct values."""
    cands = [d for d in range(len(distinct)) if len(distinct[d]) > 1]
    if not cands:
        return None
    return min(cands, key=lambda d: (violations[d], -len(distinct[d]), d))


# --- steady state and ratios ------------------------------------------------------------------


def find_steady(pops: Sequence[int | None], band: float) -> tuple[int, int] | None:
    """The longest run of forwards after the fill phase whose population stays within a band.

    The fill phase ends at the first forward whose population reaches the window's maximum
    (within the band). A run qualifies when max <= (1 + band) * min; unknown populations
    break runs. Ties go to the higher mean population, then to the earlier run.
    """
    known = [p for p in pops if p is not None and p > 0]
    if not known:
        return None
    top = max(known)
    start = next(i for i, p in enumerate(pops) if p is not None and p * (1 + band) >= top)
    best: tuple[int, float, int, int] | None = None  # (length, mean, -first, last)
    # an unknown population as 0: it breaks the run, so the window [lo, hi] never holds one
    vals = [0 if p is None else p for p in pops]
    lo = start
    maxq: deque[int] = deque()
    minq: deque[int] = deque()
    total = 0
    for hi in range(start, len(vals)):
        p = vals[hi]
        if p <= 0:
            lo, total = hi + 1, 0
            maxq.clear()
            minq.clear()
            continue
        while maxq and vals[maxq[-1]] <= p:
            maxq.pop()
        maxq.append(hi)
        while minq and vals[minq[-1]] >= p:
            minq.pop()
        minq.append(hi)
        total += p
        while vals[maxq[0]] > (1 + band) * vals[minq[0]]:
            total -= vals[lo]
            lo += 1
            if maxq[0] < lo:
                maxq.popleft()
            if minq[0] < lo:
                minq.popleft()
        cand = (hi - lo + 1, total / (hi - lo + 1), -lo, hi)
        if best is None or cand[:3] > best[:3]:
            best = cand
    if best is None:
        return None
    return -best[2], best[3]


def steady_summary(forwards: Sequence[Forward], layers: int, band: float) -> Steady | None:
    rng = find_steady([f.population for f in forwards], band)
    if rng is None:
        return None
    first, last = rng
    sel = forwards[first : last + 1]
    n = len(sel)
    return {
        "first": first,
        "last": last,
        "forwards": n,
        "population_mean": sum(f.population or 0 for f in sel) / n,
        "kernel_us_mean": sum(f.kernel_ns for f in sel) / 1000.0 / (n * layers),
        "forward_kernel_us_mean": sum(f.kernel_ns for f in sel) / 1000.0 / n,
        "forward_span_us_mean": sum(f.end_ns - f.start_ns for f in sel) / 1000.0 / n,
        "paths": [],  # the attention paths' steady state, which the trace's analysis adds
    }


def ratios(order: Sequence[str], steady: Mapping[str, Steady | None]) -> list[RatioRow]:
    """Population and kernel-duration ratios from each window to the next."""
    out: list[RatioRow] = []
    for a, b in zip(order, order[1:], strict=False):
        sa, sb = steady.get(a), steady.get(b)
        out.append(
            {
                "from": a,
                "to": b,
                "population_ratio": _ratio(sb, sa, "population_mean"),
                "duration_ratio": _ratio(sb, sa, "kernel_us_mean"),
                "paths": [],  # each attention path's ratios, which the trace's analysis adds
            }
        )
    return out


def _ratio(
    num: Steady | None, den: Steady | None, key: Literal["population_mean", "kernel_us_mean"]
) -> float | None:
    if not num or not den or not den.get(key) or num.get(key) is None:
        return None
    return float(num[key]) / float(den[key])


# --- the model's layer count --------------------------------------------------------------

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def layers_from_config(path: Path) -> int:
    cfg = read_json(path)
    for node in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        if isinstance(node, dict):
            for key in _LAYER_KEYS:
                v = node.get(key)
                if isinstance(v, int) and v > 0:
                    return v
    raise ServelabError(
        f"{path}: no layer count ({', '.join(_LAYER_KEYS)}); pass --layers N instead"
    )
