"""Reading an `nsys export --type sqlite` file, in SQL passes whose memory does not grow with
the trace.

A saturated run holds millions of kernel rows, so no pass brings every row into Python:
- busy time (union of kernel intervals per device and window) is one INSERT ... SELECT into a
  tiny accumulator table keyed by (window, device); its upsert keeps the merge state (end of
  the current busy run). Rows in start order are merged exactly; the same pass counts rows that
  arrive out of order, and only then is the pass redone with ORDER BY.
- per-kernel totals are one upsert keyed by (window, name, grid).
- only launches of the main attention kernel (one per layer per forward) are streamed to
  Python, in start order.

Schema facts relied on (Nsight Systems SQLite export): CUPTI_ACTIVITY_KIND_KERNEL(start, "end",
deviceId, streamId, demangledName, shortName -> StringIds.id, gridX/Y/Z, graphNodeId, ...);
NVTX_EVENTS(start, "end", eventType, text, textId -> StringIds.id, domainId, int64Value,
uint64Value, ...) with eventType 59/60 for push-pop/start-end ranges and 75 for a domain's
creation (its name in text); TARGET_INFO_SESSION_START_TIME.utcEpochNs; TARGET_INFO_GPU(id,
name); META_DATA_EXPORT(name, value). Tables are created lazily: an absent table means no
events of that kind. Timestamps count from the session start, or are epoch nanoseconds when
exported with --ts-normalize (told apart by magnitude).
"""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

from servelab.errors import ServelabError
from servelab.profile.core import KernelStat, ResolvedWindow, Window, to_trace_clock

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
NVTX = "NVTX_EVENTS"
KERNEL_COLUMNS = (
    "start",
    "end",
    "deviceId",
    "demangledName",
    "shortName",
    "gridX",
    "gridY",
    "gridZ",
)
NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
NVTX_DOMAIN_CREATE = 75
NVTX_DOMAIN = "servelab"
EPOCH_FLOOR_NS = 10**17  # a session-relative timestamp this large would be a 3-year session
SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(16) == SQLITE_MAGIC


class NsysTrace:
    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise ServelabError(f"{path}: file not found")
        self.uri = f"{path.resolve().as_uri()}?mode=ro"
        self.con = self._connect()
        try:
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")
            self.tables = {str(r[0]) for r in rows}
        except sqlite3.DatabaseError as exc:
            raise ServelabError(f"{path}: not an SQLite database ({exc})") from None
        if self.has(KERNEL):
            missing = [c for c in KERNEL_COLUMNS if c not in self.columns(KERNEL)]
            if missing:
                raise ServelabError(
                    f"{path}: table {KERNEL} lacks column(s) {', '.join(missing)}; is this an "
                    "nsys SQLite export?"
                )
        self._strings: dict[int, str] = {}
        self.ordered = False  # rows stored in start order (found by the busy pass)

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
        con.execute("PRAGMA cache_size = -16384")  # 16 MiB: bounded, whatever the trace size
        return con

    def close(self) -> None:
        self.con.close()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        return {str(r[1]) for r in self.con.execute(f'PRAGMA table_info("{table}")')}

    # --- facts ------------------------------------------------------------------------------

    def session_start_ns(self) -> int | None:
        if not self.has("TARGET_INFO_SESSION_START_TIME"):
            return None
        row = self.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def meta(self) -> dict[str, str]:
        if not self.has("META_DATA_EXPORT"):
            return {}
        return {
            str(k): str(v)
            for k, v in self.con.execute("SELECT name, value FROM META_DATA_EXPORT")
            if str(k).startswith("EXPORT_") and not str(k).startswith("EXPORT_PARAM")
        }

    def devices(self) -> dict[str, str]:
        if not self.has("TARGET_INFO_GPU"):
            return {}
        return {
            str(i): str(n or "")
            for i, n in self.con.execute("SELECT DISTINCT id, name FROM TARGET_INFO_GPU")
        }

    def clock(self) -> str:
        """The trace's clock: epoch when exported with --ts-normalize, else trace."""
        for table in (KERNEL, NVTX):
            if self.has(table):
                row = self.con.execute(f"SELECT start FROM {table} LIMIT 1").fetchone()
                if row is not None:
                    return "epoch" if int(row[0]) >= EPOCH_FLOOR_NS else "trace"
        return "trace"

    def strings(self, ids: Sequence[int]) -> dict[int, str]:
        need = sorted({i for i in ids if i not in self._strings})
        for chunk in range(0, len(need), 500):
            part = need[chunk : chunk + 500]
            marks = ",".join("?" * len(part))
            for i, v in self.con.execute(
                f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part
            ):
                self._strings[int(i)] = str(v)
        return {i: self._strings.get(i, f"<string {i}>") for i in ids}

    def info(self) -> dict[str, Any]:
        return {
            "kind": "nsys-sqlite",
            "clock": self.clock(),
            "session_start_utc_ns": self.session_start_ns(),
            "exporter": self.meta(),
            "devices": self.devices(),
            "tables_absent": sorted(
                t
                for t in (
                    KERNEL,
                    NVTX,
                    "TARGET_INFO_GPU",
                    "TARGET_INFO_SESSION_START_TIME",
                    "META_DATA_EXPORT",
                    "StringIds",
                )
                if not self.has(t)
            ),
        }

    # --- windows ----------------------------------------------------------------------------

    def nvtx_windows(self, labels: Sequence[str]) -> dict[str, tuple[int, int, int]]:
        """Start/end ranges servelab's client emitted (domain "servelab", one registered
        message per point, the request index as payload): label -> (first start, last end,
        requests)."""
        if not labels or not self.has(NVTX) or not self.has("StringIds"):
            return {}
        marks = ",".join("?" * len(labels))
        types = ",".join(map(str, NVTX_RANGE_TYPES))
        sql = f"""
            SELECT COALESCE(e.text, s.value) AS msg, MIN(e.start), MAX(e."end"),
                   COUNT(DISTINCT COALESCE(e.int64Value, e.uint64Value, e.rowid))
            FROM {NVTX} AS e LEFT JOIN StringIds AS s ON s.id = e.textId
            WHERE e.eventType IN ({types}) AND e."end" IS NOT NULL
              AND e.domainId IN (SELECT domainId FROM {NVTX}
                                 WHERE eventType = {NVTX_DOMAIN_CREATE} AND text = ?)
              AND COALESCE(e.text, s.value) IN ({marks})
            GROUP BY msg"""
        return {
            str(m): (int(lo), int(hi), int(n))
            for m, lo, hi, n in self.con.execute(sql, [NVTX_DOMAIN, *labels])
        }

    def resolve(self, windows: Sequence[Window]) -> list[ResolvedWindow]:
        clock = self.clock()
        start = self.session_start_ns()
        nvtx = self.nvtx_windows([w.label for w in windows])
        out = []
        for w in windows:
            if w.label in nvtx:
                lo, hi, n = nvtx[w.label]
                out.append(ResolvedWindow(w.label, lo, hi, "nvtx", w.output_tokens, n))
            else:
                lo, hi = to_trace_clock(w, clock, start, str(self.path))
                src = "wallclock" if w.clock == "epoch" else "trace"
                out.append(ResolvedWindow(w.label, lo, hi, src, w.output_tokens))
        return out

    # --- passes -----------------------------------------------------------------------------

    def busy_and_stats(
        self, windows: Sequence[ResolvedWindow]
    ) -> tuple[list[dict[str, int]], list[list[KernelStat]]]:
        """Both full-table passes at once, each on its own connection: SQLite runs them
        outside the GIL, so on two cores they take the time of the slower one."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            busy = pool.submit(self.busy, windows)
            stats = pool.submit(self.stats, windows)
            return busy.result(), stats.result()

    def busy(self, windows: Sequence[ResolvedWindow]) -> list[dict[str, int]]:
        """Per window and device: nanoseconds covered by at least one kernel (clipped to the
        window). Kernels on different streams overlap, so durations are never summed."""
        out: list[dict[str, int]] = [{} for _ in windows]
        if not windows or not self.has(KERNEL):
            return out
        with closing(self._connect()) as con:
            rows = []
            if self._looks_ordered(con):
                rows = self._busy_pass(con, windows, ordered=False)
                self.ordered = not any(r[3] for r in rows)
            if not self.ordered:
                rows = self._busy_pass(con, windows, ordered=True)
        for w, d, busy, _ in rows:
            out[w][str(d)] = int(busy)
        return out

    def _looks_ordered(self, con: sqlite3.Connection, sample: int = 100_000) -> bool:
        """Whether the first rows are stored in start order per device: then the single pass
        is tried (and still checked row by row); else the sorted pass is run at once."""
        row = con.execute(
            f"""SELECT COUNT(*) FROM (
                    SELECT start < LAG(start) OVER (PARTITION BY deviceId ORDER BY rowid) AS back
                    FROM (SELECT rowid, deviceId, start FROM {KERNEL} LIMIT {int(sample)}))
                WHERE back"""
        ).fetchone()
        return int(row[0]) == 0

    def _busy_pass(
        self, con: sqlite3.Connection, windows: Sequence[ResolvedWindow], ordered: bool
    ) -> list[tuple[int, int, int, int]]:
        """One upsert per kernel row into a (window, device) accumulator that keeps the
        current busy run: in start order, a row adds the part of it past the run's end.
        Rows are not clipped per row (that costs a CASE per bound): the first run can only
        begin before the window's start and the last run only end after its end, so the
        overhang is taken off once per key at the end."""
        con.execute("DROP TABLE IF EXISTS temp.busy")
        con.execute(
            "CREATE TEMP TABLE busy (w INTEGER, d INTEGER, s0 INTEGER, s INTEGER, e INTEGER, "
            "busy INTEGER, disorder INTEGER, PRIMARY KEY (w, d))"
        )
        which = _case('start < {hi} AND "end" > {lo}', windows)
        order = "ORDER BY d, s" if ordered else ""
        con.execute(
            f"""
            INSERT INTO temp.busy (w, d, s0, s, e, busy, disorder)
            SELECT w, d, s, s, e, e - s, 0
            FROM (SELECT {which} AS w, deviceId AS d, start AS s, "end" AS e
                  FROM {KERNEL}
                  WHERE start < {max(w.hi for w in windows)}
                    AND "end" > {min(w.lo for w in windows)})
            WHERE w IS NOT NULL {order}
            ON CONFLICT (w, d) DO UPDATE SET
                busy = busy + MAX(0, excluded.e - MAX(excluded.s, e)),
                e = MAX(e, excluded.e),
                disorder = disorder + (excluded.s < s),
                s = excluded.s
            """
        )
        rows = con.execute(
            "SELECT w, d, busy, s0, e, disorder FROM temp.busy ORDER BY w, d"
        ).fetchall()
        out = []
        for w, d, busy, s0, e, disorder in rows:
            lo, hi = windows[int(w)].lo, windows[int(w)].hi
            clipped = int(busy) - max(0, lo - int(s0)) - max(0, int(e) - hi)
            out.append((int(w), int(d), clipped, int(disorder)))
        return out

    def stats(self, windows: Sequence[ResolvedWindow]) -> list[list[KernelStat]]:
        """Per window: calls and total duration of each kernel name and grid (a kernel belongs
        to the window it starts in)."""
        out: list[list[KernelStat]] = [[] for _ in windows]
        if not windows or not self.has(KERNEL):
            return out
        with closing(self._connect()) as con:
            con.execute(
                "CREATE TEMP TABLE k (w INTEGER, n INTEGER, sn INTEGER, gx INTEGER, gy INTEGER, "
                "gz INTEGER, calls INTEGER, dur INTEGER, PRIMARY KEY (w, n, gx, gy, gz))"
            )
            which = _case("start >= {lo} AND start < {hi}", windows)
            con.execute(
                f"""
                INSERT INTO temp.k (w, n, sn, gx, gy, gz, calls, dur)
                SELECT w, n, sn, gx, gy, gz, 1, dur
                FROM (SELECT {which} AS w, demangledName AS n, shortName AS sn, gridX AS gx,
                             gridY AS gy, gridZ AS gz, "end" - start AS dur
                      FROM {KERNEL}
                      WHERE start >= {min(w.lo for w in windows)}
                        AND start < {max(w.hi for w in windows)})
                WHERE w IS NOT NULL
                ON CONFLICT (w, n, gx, gy, gz) DO UPDATE SET
                    calls = calls + 1, dur = dur + excluded.dur
                """
            )
            rows = con.execute("SELECT w, n, sn, gx, gy, gz, calls, dur FROM temp.k").fetchall()
        names = self.strings([int(r[1]) for r in rows] + [int(r[2]) for r in rows])
        for w, n, sn, gx, gy, gz, calls, dur in rows:
            out[int(w)].append(
                KernelStat(
                    name=names[int(sn)],
                    full=names[int(n)],
                    calls=int(calls),
                    total_ns=int(dur),
                    grid=(int(gx), int(gy), int(gz)),
                )
            )
        return out

    def launches(
        self, windows: Sequence[ResolvedWindow], full_names: set[str]
    ) -> Iterator[tuple[int, str, int, int, tuple[int, int, int]]]:
        """Launches of the main attention kernel, in start order per device (as stored when
        the busy pass found the rows ordered, else sorted): (window index, device, start, end,
        grid)."""
        if not windows or not full_names or not self.has(KERNEL):
            return
        names = sorted(full_names)
        ids = [
            int(r[0])
            for r in self.con.execute(
                f"SELECT id FROM StringIds WHERE value IN ({','.join('?' * len(names))})", names
            )
        ]
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        bounds = [(w.lo, w.hi) for w in windows]
        cur = self.con.execute(
            f"""SELECT deviceId, start, "end", gridX, gridY, gridZ FROM {KERNEL}
                WHERE demangledName IN ({marks})
                  AND start >= {min(b[0] for b in bounds)} AND start < {max(b[1] for b in bounds)}
                {"" if self.ordered else "ORDER BY deviceId, start"}""",
            ids,
        )
        los = [b[0] for b in bounds]
        while True:
            rows = cur.fetchmany(8192)
            if not rows:
                break
            for d, s, e, gx, gy, gz in rows:
                i = bisect.bisect_right(los, s) - 1
                if i >= 0 and s < bounds[i][1]:
                    yield i, str(d), int(s), int(e), (int(gx), int(gy), int(gz))


def _case(cond: str, windows: Sequence[ResolvedWindow]) -> str:
    """SQL for the index of the window a row falls in (NULL for none); `cond` is a template
    with {lo} and {hi}. The bounds are integers from the windows, never user text."""
    parts = [
        f"WHEN {cond.format(lo=int(w.lo), hi=int(w.hi))} THEN {i}" for i, w in enumerate(windows)
    ]
    return "CASE " + " ".join(parts) + " END"
