"""The main attention kernel's launches, read from an nsys export in one pass: its calls and
time per window and grid, each grid dimension's values, and its forwards per window and GPU
(servelab.profile.nsys has the schema facts this relies on). Only these launches (one per layer
per forward) reach Python, streamed in chunks; every other kernel row stays in SQLite.

`window_case` is the SQL that finds the window a kernel row falls in, shared with the
full-table passes of servelab.profile.nsys.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.profile.forwards import ForwardGrouper
from servelab.profile.kernels import KernelStat
from servelab.profile.windows import ResolvedWindow

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


class MainSource(Protocol):
    """What the main pass reads an export through (servelab.profile.nsys.NsysTrace): its
    connection, the SQL for a kernel row's GPU, and which tables it has."""

    con: sqlite3.Connection
    gpu_expr: str

    def has(self, table: str) -> bool: ...


def name_ids(src: MainSource, names: Sequence[str]) -> dict[int, str]:
    """StringIds ids of the given kernel names (those the export holds)."""
    names = sorted(names)
    if not names:
        return {}
    return {
        int(i): str(v)
        for i, v in src.con.execute(
            f"SELECT id, value FROM StringIds WHERE value IN ({','.join('?' * len(names))})",
            names,
        )
    }


def main_pass(src: MainSource, windows: Sequence[ResolvedWindow], query: MainQuery) -> MainPass:
    """One read of the main attention kernel's launches (one row in a few): its calls and
    time per window and grid, each grid dimension's values, and, when the layer count is
    known, its forwards per window and GPU for each grid dimension in `query.dims` that
    may carry the population (the caller picks one once every value is seen). With
    several names (instantiations) and their labels, a launch's key carries its label
    after the grid; with `query.origins`, each forward records its first launch's
    (globalPid, correlationId). Rows are read as stored while each GPU's launches come
    in start order, else again, sorted."""
    res = MainPass([[] for _ in windows])
    if not windows or not query.full_names or not src.has(KERNEL):
        return res
    ids = name_ids(src, sorted(query.full_names))
    if not ids:
        return res
    labels = query.labels
    lab = {i: labels[v] for i, v in ids.items() if v in labels} if labels else {}
    if len(ids) < 2 or len(lab) != len(ids):
        lab = {}
    for ordered in (False, True):
        got = _main_pass(src, windows, ids, lab, query, ordered)
        if got is not None:
            return got
    raise AssertionError("sorted launches came out of order")  # pragma: no cover


def main_launches(
    src: MainSource,
    windows: Sequence[ResolvedWindow],
    ids: Mapping[int, str],
    origins: bool,
    ordered: bool,
) -> sqlite3.Cursor:
    """The main kernel's launches in the windows: window, name id, GPU, start, end, grid
    (and with `origins`, globalPid and correlationId); with `ordered`, sorted by GPU and
    start."""
    which = window_case(windows, "{i}", overlap=False, outside="NULL")
    # one name (the usual case): its id is not read per row
    name = str(next(iter(ids))) if len(ids) == 1 else "n"
    outer, inner = (", p, c", ", globalPid AS p, correlationId AS c") if origins else ("", "")
    return src.con.execute(
        f"""SELECT w, {name}, d, s, e, gx, gy, gz{outer}
            FROM (SELECT {which} AS w, demangledName AS n, {src.gpu_expr} AS d,
                         start AS s, "end" AS e, gridX AS gx, gridY AS gy,
                         gridZ AS gz{inner}
                  FROM {KERNEL}
                  WHERE demangledName IN ({",".join("?" * len(ids))})
                    AND start >= {min(w.lo for w in windows)}
                    AND start < {max(w.hi for w in windows)})
            WHERE w IS NOT NULL
            {"ORDER BY d, s" if ordered else ""}""",
        list(ids),
    )


def _main_pass(
    src: MainSource,
    windows: Sequence[ResolvedWindow],
    ids: Mapping[int, str],
    lab: Mapping[int, str],
    query: MainQuery,
    ordered: bool,
) -> MainPass | None:
    """The main pass over the launches as read (`ordered`: sorted); None when a GPU's
    launches in a window come out of start order (then read again, sorted)."""
    cur = main_launches(src, windows, ids, query.origins, ordered)
    grid: dict[tuple[int, ...], list[int]] = {}
    last: dict[tuple[int, int], int] = {}
    layers = query.layers
    groupers: dict[int, dict[tuple[int, str], ForwardGrouper]] = (
        {d: {} for d in query.dims} if layers is not None else {}
    )
    nkey = 4 if lab else 3  # key columns: the grid, and the instantiation's label
    while rows := cur.fetchmany(8192):
        for (w, d), (starts, ends, rcols) in _chunk_runs(rows, grid, lab, query).items():
            prev = last.get((w, d))
            if (prev is not None and starts[0] < prev) or list(starts) != sorted(starts):
                cur.close()
                return None
            last[(w, d)] = starts[-1]
            for dim, per in groupers.items():
                assert layers is not None
                g = per.get((w, str(d)))
                if g is None:
                    g = per[(w, str(d))] = ForwardGrouper(layers)
                g.feed_columns(
                    starts,
                    ends,
                    rcols[dim],
                    rcols[dim],
                    rcols[:nkey],
                    rcols[nkey] if query.origins else None,
                )
    res = MainPass([[] for _ in windows], groupers)
    for (w, n, gx, gy, gz), (calls, dur) in grid.items():
        full = ids[n]
        res.stats[w].append(
            KernelStat(query.display.get(full, full), full, calls, dur, grid=(gx, gy, gz))
        )
        for dim, v in enumerate((gx, gy, gz)):
            res.distinct[dim].add(v)
    return res


@dataclass(frozen=True)
class MainQuery:
    """What the main pass reads of the main attention kernel: its full names and the names
    shown (nsys shortName), the layer count (None: no forwards), the grid dimensions that may
    carry the population, its instantiations' labels (full name -> "#1", ...), and whether
    each forward records its first launch's origin."""

    full_names: set[str]
    display: Mapping[str, str]
    layers: int | None
    dims: Sequence[int]
    labels: Mapping[str, str] | None = None
    origins: bool = False


Run = tuple[Sequence[int], Sequence[int], list[Any]]


def _chunk_runs(
    rows: list[Any],
    grid: dict[tuple[int, ...], list[int]],
    lab: Mapping[int, str],
    query: MainQuery,
) -> dict[tuple[int, int], Run]:
    """One chunk of the main pass's rows: adds its calls and time per (window, name, grid)
    to `grid`, and returns its launches per (window, device) as starts, ends and the key
    columns (the grid, the instantiation's label with `lab`, the origin with
    `query.origins`). Column by column: the work per row stays in C."""
    w_, n_, d_, s_, e_, gx_, gy_, gz_, *more = zip(*rows, strict=True)
    grids = [gx_, gy_, gz_]
    _add_grid(grid, (w_, n_, *grids), s_, e_)
    cols: list[Sequence[Any]] = list(grids)
    if lab:
        cols.append([lab[n_[0]]] * len(n_) if _constant(n_) else [lab[i] for i in n_])
    if query.origins:
        cols.append(list(zip(more[0], more[1], strict=True)))
    if _constant(w_) and _constant(d_):  # one window, one device: the usual chunk
        return {(w_[0], d_[0]): (s_, e_, cols)}
    at: dict[tuple[int, int], list[int]] = {}
    for j, k in enumerate(zip(w_, d_, strict=True)):
        at.setdefault(k, []).append(j)
    return {
        k: (
            [s_[j] for j in js],
            [e_[j] for j in js],
            [[g[j] for j in js] for g in cols],
        )
        for k, js in at.items()
    }


def _constant(col: tuple[int, ...]) -> bool:
    return col.count(col[0]) == len(col)


def _add_grid(
    acc: dict[tuple[int, ...], list[int]],
    key_cols: Sequence[tuple[int, ...]],
    starts: Sequence[int],
    ends: Sequence[int],
) -> None:
    """Calls and time per key (window, name, grid) of one chunk of launches, given as
    columns."""
    if all(_constant(c) for c in key_cols):
        a = acc.setdefault(tuple(c[0] for c in key_cols), [0, 0])
        a[0] += len(starts)
        a[1] += sum(ends) - sum(starts)
        return
    for k, s, e in zip(zip(*key_cols, strict=True), starts, ends, strict=True):
        b = acc.get(k)
        if b is None:
            acc[k] = [1, e - s]
        else:
            b[0] += 1
            b[1] += e - s


@dataclass
class MainPass:
    """What the read of the main attention kernel's launches found."""

    stats: list[list[KernelStat]]  # per window: the main kernel(s), split by grid
    # per grid dimension that may carry the population: forwards per (window, device)
    groupers: dict[int, dict[tuple[int, str], ForwardGrouper]] = field(default_factory=dict)
    distinct: list[set[int]] = field(default_factory=lambda: [set(), set(), set()])


# The key of rows outside every window: they are counted under it, and it is dropped (a WHERE
# clause that tests the window costs SQLite a second evaluation of the CASE that finds it).
# Keys are id x windows + window, ids are non-negative.
NOWHERE = -(2**62)


def window_case(
    windows: Sequence[ResolvedWindow], then: str, overlap: bool, outside: str = str(NOWHERE)
) -> str:
    """SQL for `then` (a template with {i}, the window's index) of the window a kernel row
    falls in, else `outside`: the window its start is in, or with `overlap`, the first window
    it overlaps. A binary search on start over the windows sorted by start (they are disjoint,
    see check_disjoint), so about log2(windows) comparisons per row. The bounds are integers
    from the windows, never user text."""
    order = sorted(range(len(windows)), key=lambda i: windows[i].lo)

    def node(a: int, b: int) -> str:
        if b - a == 1:
            i = order[a]
            w = windows[i]
            cond = f'"end" > {int(w.lo)}' if overlap else f"start >= {int(w.lo)}"
            return (
                f"CASE WHEN {cond} AND start < {int(w.hi)} THEN {then.format(i=i)} "
                f"ELSE {outside} END"
            )
        m = (a + b) // 2
        # overlap: the first window that ends after the start; else: the one it starts in
        split = windows[order[m - 1]].hi if overlap else windows[order[m]].lo
        return f"CASE WHEN start < {int(split)} THEN {node(a, m)} ELSE {node(m, b)} END"

    return node(0, len(windows))


def main_origins(
    src: MainSource, windows: Sequence[ResolvedWindow], ids: Mapping[int, str]
) -> list[tuple[int, int]]:
    """The distinct (globalPid, correlationId) of the main kernel's launches in the windows'
    span (one per launch, one per CUDA-graph replay)."""
    if not windows or not ids:
        return []
    rows = src.con.execute(
        f"""SELECT DISTINCT globalPid, correlationId FROM {KERNEL}
            WHERE demangledName IN ({",".join("?" * len(ids))})
              AND start >= {min(w.lo for w in windows)} AND start < {max(w.hi for w in windows)}
              AND globalPid IS NOT NULL AND correlationId IS NOT NULL""",
        list(ids),
    )
    return [(int(p), int(c)) for p, c in rows]
