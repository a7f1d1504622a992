"""Reading an `nsys export --type sqlite` file, in SQL passes whose memory does not grow with
the trace.

A saturated run holds millions of kernel rows, so no pass brings every row into Python:
- busy time (union of kernel intervals per device and window) is one INSERT ... SELECT into a
  tiny accumulator table keyed by (window, device); its upsert keeps the merge state (end of
  the current busy run). Rows in start order are merged exactly; the same pass counts rows that
  arrive out of order, and only then is the pass redone with ORDER BY.
- per-kernel totals are one upsert keyed by (window, name).
- both accumulators are keyed by one integer (name or device x windows + window), SQLite's
  rowid: an upsert then costs one b-tree seek, about half of what a composite key costs.
- only launches of the main attention kernel (one per layer per forward) are read into
  Python, in chunks: their time per grid (the attention paths) and the forwards come from them.

Schema facts relied on (Nsight Systems User Guide, "SQLite Schema Reference" and "Common
SQLite examples", 2024.6 to 2026.4): CUPTI_ACTIVITY_KIND_KERNEL(start, "end", deviceId,
streamId, correlationId, globalPid, demangledName, shortName, mangledName -> StringIds.id,
gridX/Y/Z, graphNodeId, ...), where deviceId is the CUDA device id as the process saw it
(after CUDA_VISIBLE_DEVICES); TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid, uuid, ...) maps a
process's CUDA device to TARGET_INFO_GPU.id (through the UUID where both tables have one), and
TARGET_INFO_GPU(id, name, uuid, ...) lists every GPU nsys sees, used or not (inside a container
only the container's, numbered from 0: the UUID, not the id, names the host's GPU;
servelab.profile.gpumatch); CUPTI_ACTIVITY_KIND_RUNTIME(start, "end", globalTid,
correlationId, nameId, ...) holds the CUDA API call that launched each kernel (same
correlationId within a process: the documented recipe "Correlate CUDA kernel launches with
CUDA API kernel launches"; with --cuda-graph-trace=node every kernel of a graph replay carries
its cudaGraphLaunch's correlationId); NVTX_EVENTS(start, "end", eventType, text, textId ->
StringIds.id, globalTid, domainId, int64Value, uint64Value, ...) with eventType 59/60 for
push-pop/start-end ranges and 75 for a domain's creation (its name in text); serialized ids:
PID = globalTid / 0x1000000 % 0x1000000; TARGET_INFO_SESSION_START_TIME.utcEpochNs;
META_DATA_EXPORT(name, value). Tables are created lazily: an absent table means no events of
that kind (TARGET_INFO_CUDA_DEVICE is absent from older exports: deviceId is then taken as the
GPU id, and the profile says so). Timestamps count from the session start, or are epoch
nanoseconds when exported with --ts-normalize (told apart by magnitude).

vLLM's step ranges are read here and named in servelab.profile.steps; the main attention kernel's
launches are read by servelab.profile.nsys_main.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

from servelab.documents.declared import DeviceMap, TraceInfo
from servelab.errors import ServelabError
from servelab.profile.gpumatch import normal_uuid
from servelab.profile.kernels import KernelStat
from servelab.profile.nsys_main import NOWHERE, MainPass, MainQuery, main_pass, window_case
from servelab.profile.steps import StepRange, parse_step_range
from servelab.profile.windows import ResolvedWindow, Window, to_trace_clock

__all__ = ["KERNEL", "RUNTIME", "MainQuery", "NsysTrace", "StepRange", "is_sqlite"]

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
NVTX = "NVTX_EVENTS"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
CUDA_DEVICE = "TARGET_INFO_CUDA_DEVICE"
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
SERIAL = 0x1000000  # serialized process/thread ids: PID = globalTid / SERIAL % SERIAL


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
        self.gpu_expr, self.device_map = self._device_map()
        self.client_ranges: dict[str, tuple[int, int, int]] = {}  # found by resolve

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
        """Every GPU of the host (TARGET_INFO_GPU.id -> name), used or not."""
        if not self.has("TARGET_INFO_GPU"):
            return {}
        return {
            str(i): str(n or "")
            for i, n in self.con.execute("SELECT DISTINCT id, name FROM TARGET_INFO_GPU")
        }

    def gpu_uuids(self) -> dict[str, str | None]:
        """Every GPU of the trace (TARGET_INFO_GPU.id) -> its UUID, None where the export has
        none (an older export without the column, or an empty value)."""
        if not self.has("TARGET_INFO_GPU"):
            return {}
        if "uuid" not in self.columns("TARGET_INFO_GPU"):
            return {i: None for i in self.devices()}
        return {
            str(i): str(u) if u else None
            for i, u in self.con.execute("SELECT DISTINCT id, uuid FROM TARGET_INFO_GPU")
        }

    def _cuda_devices(self) -> list[tuple[int | None, int, int, str | None, str]]:
        """TARGET_INFO_CUDA_DEVICE's rows (pid, cudaId, GPU, UUID, how the GPU was found):
        the GPU is the TARGET_INFO_GPU.id whose UUID is the row's (by "uuid"), else its
        gpuId (by "gpuId")."""
        cols = self.columns(CUDA_DEVICE)
        pid = "pid" if "pid" in cols else "NULL"
        uuid = "uuid" if "uuid" in cols else "NULL"
        ids = {normal_uuid(u): int(i) for i, u in self.gpu_uuids().items() if u and i.isdigit()}
        rows = set()
        for p, c, g, u in self.con.execute(
            f"SELECT {pid}, cudaId, gpuId, {uuid} FROM {CUDA_DEVICE}"
        ):
            if c is None or g is None:
                continue
            found = ids.get(normal_uuid(u))
            gpu, by = (found, "uuid") if found is not None else (int(g), "gpuId")
            rows.add((None if p is None else int(p), int(c), gpu, str(u) if u else None, by))
        return sorted(rows, key=lambda r: (r[0] is None, r[0] or 0, r[1], r[2]))

    def _device_map(self) -> tuple[str, DeviceMap]:
        """SQL for a kernel row's GPU (TARGET_INFO_GPU.id), and the record of how it was found:
        deviceId through TARGET_INFO_CUDA_DEVICE (per process when processes see their CUDA
        devices differently, e.g. one CUDA_VISIBLE_DEVICES per worker; the GPU by UUID where
        both tables have one), else deviceId itself. A device missing from the table keeps
        its deviceId."""
        cols = self.columns(CUDA_DEVICE) if self.has(CUDA_DEVICE) else set()
        if not {"gpuId", "cudaId"} <= cols:
            return "deviceId", {"source": "deviceId", "cuda_devices": []}
        full = self._cuda_devices()
        info: DeviceMap = {
            "source": CUDA_DEVICE,
            "cuda_devices": [
                {"pid": p, "cuda_id": c, "gpu_id": g, "uuid": u, "by": by}
                for p, c, g, u, by in full
            ],
        }
        rows = [(p, c, g) for p, c, g, _, _ in full]
        per_cuda: dict[int, set[int]] = {}
        for _, c, g in rows:
            per_cuda.setdefault(c, set()).add(g)
        if all(len(v) == 1 for v in per_cuda.values()):
            pairs = {c: min(v) for c, v in per_cuda.items()}
            if all(c == g for c, g in pairs.items()):
                return "deviceId", info
            whens = " ".join(f"WHEN {c} THEN {g}" for c, g in sorted(pairs.items()))
            return f"(CASE deviceId {whens} ELSE deviceId END)", info
        whens = " ".join(
            f"WHEN deviceId = {c} AND globalPid / {SERIAL} % {SERIAL} = {p} THEN {g}"
            for p, c, g in rows
            if p is not None
        )
        whens += "".join(f" WHEN deviceId = {c} THEN {g}" for p, c, g in rows if p is None)
        return f"(CASE {whens} ELSE deviceId END)", info

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

    def info(self) -> TraceInfo:
        return {
            "kind": "nsys-sqlite",
            "clock": self.clock(),
            "session_start_utc_ns": self.session_start_ns(),
            "exporter": self.meta(),
            "devices": self.devices(),
            "device_map": self.device_map,
            "tables_absent": sorted(
                t
                for t in (
                    KERNEL,
                    NVTX,
                    RUNTIME,
                    CUDA_DEVICE,
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
        nvtx = self.client_ranges = self.nvtx_windows([w.label for w in windows])
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

    # --- vLLM's steps -----------------------------------------------------------------------

    def step_ranges(self) -> list[StepRange]:
        """vLLM's per-step NVTX ranges (push/pop or start/end, any domain), sorted by thread and
        start."""
        if not self.has(NVTX):
            return []
        cols = self.columns(NVTX)
        joined = self.has("StringIds") and "textId" in cols
        text = "COALESCE(e.text, s.value)" if joined else "e.text"
        join = "LEFT JOIN StringIds AS s ON s.id = e.textId" if joined else ""
        tid = "e.globalTid" if "globalTid" in cols else "0"
        types = ",".join(map(str, NVTX_RANGE_TYPES))
        out = []
        for start, end, thread, msg in self.con.execute(
            f"""SELECT e.start, e."end", {tid}, {text} FROM {NVTX} AS e {join}
                WHERE e.eventType IN ({types}) AND e."end" IS NOT NULL
                  AND {text} LIKE 'execute%'"""
        ):
            got = parse_step_range(str(msg))
            if got is not None:
                form, ctx, gen, ctx_tok, gen_tok = got
                thread_id = int(thread or 0)
                out.append(
                    StepRange(int(start), int(end), thread_id, ctx, gen, ctx_tok, gen_tok, form)
                )
        out.sort(key=lambda r: (r.tid, r.start, r.end))
        return out

    def launch_hosts(
        self, origins: Iterable[tuple[int, int]]
    ) -> dict[tuple[int, int], tuple[int, int]]:
        """(globalPid, correlationId) of kernel launches -> (globalTid, start) of the CUDA API
        call that made them (CUPTI_ACTIVITY_KIND_RUNTIME, same correlationId in the same
        process). One scan of the runtime table, each row looked up among the origins."""
        want = sorted({(int(p), int(c)) for p, c in origins if p is not None and c is not None})
        if not want or not self.has(RUNTIME):
            return {}
        out: dict[tuple[int, int], tuple[int, int]] = {}
        with closing(self._connect()) as con:
            con.execute(
                "CREATE TEMP TABLE want (corr INTEGER, gpid INTEGER, PRIMARY KEY (corr, gpid)) "
                "WITHOUT ROWID"
            )
            con.executemany("INSERT INTO temp.want VALUES (?, ?)", [(c, p) for p, c in want])
            # CROSS JOIN keeps the runtime table as the outer loop (one scan, a seek per row)
            for gpid, corr, thread, start in con.execute(
                f"""SELECT w.gpid, r.correlationId, r.globalTid, MIN(r.start)
                    FROM {RUNTIME} AS r CROSS JOIN temp.want AS w
                    ON w.corr = r.correlationId
                       AND w.gpid = r.globalTid - r.globalTid % {SERIAL}
                    GROUP BY w.gpid, r.correlationId"""
            ):
                out[(int(gpid), int(corr))] = (int(thread), int(start))
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

    def _looks_ordered(self, con: sqlite3.Connection, sample: int = 20_000) -> bool:
        """Whether the first rows are stored in start order per device: then the single pass
        is tried (and still checked row by row); else the sorted pass is run at once. (Checked
        here rather than with LAG() OVER (PARTITION BY ...): SQLite's window functions cost a
        tenth of a second even on a small sample.)"""
        last: dict[int, int] = {}
        sql = f"SELECT {self.gpu_expr}, start FROM {KERNEL} LIMIT {int(sample)}"
        for d, s in con.execute(sql):
            if s < last.get(d, s):
                return False
            last[d] = s
        return True

    def _busy_pass(
        self, con: sqlite3.Connection, windows: Sequence[ResolvedWindow], ordered: bool
    ) -> list[tuple[int, int, int, int]]:
        """One upsert per kernel row into a (window, device) accumulator that keeps the
        current busy run: in start order, a row adds the part of it past the run's end.
        Rows are not clipped per row (that costs a CASE per bound): the first run can only
        begin before the window's start and the last run only end after its end, so the
        overhang is taken off once per key at the end."""
        n = len(windows)
        con.execute("DROP TABLE IF EXISTS temp.busy")
        con.execute(
            "CREATE TEMP TABLE busy (key INTEGER PRIMARY KEY, s0 INTEGER, s INTEGER, e INTEGER, "
            "busy INTEGER, disorder INTEGER)"
        )
        key = window_case(windows, f"{self.gpu_expr} * {n} + {{i}}", overlap=True)
        order = f"ORDER BY {self.gpu_expr}, start" if ordered else ""
        con.execute(
            f"""
            INSERT INTO temp.busy (key, s0, s, e, busy, disorder)
            SELECT {key}, start, start, "end", "end" - start, 0
            FROM {KERNEL}
            WHERE start < {max(w.hi for w in windows)} AND "end" > {min(w.lo for w in windows)}
            {order}
            ON CONFLICT (key) DO UPDATE SET
                busy = busy + CASE WHEN excluded.e <= e THEN 0
                                   WHEN excluded.s > e THEN excluded.e - excluded.s
                                   ELSE excluded.e - e END,
                e = CASE WHEN excluded.e > e THEN excluded.e ELSE e END,
                disorder = disorder + (excluded.s < s),
                s = excluded.s
            """
        )
        rows = con.execute(
            f"SELECT key, busy, s0, e, disorder FROM temp.busy WHERE key != {NOWHERE}"
        ).fetchall()
        out = []
        for key, busy, s0, e, disorder in rows:
            d, w = divmod(int(key), n)
            lo, hi = windows[w].lo, windows[w].hi
            clipped = int(busy) - max(0, lo - int(s0)) - max(0, int(e) - hi)
            out.append((w, d, clipped, int(disorder)))
        out.sort()
        return out

    def stats(self, windows: Sequence[ResolvedWindow]) -> list[list[KernelStat]]:
        """Per window: calls and total duration of each kernel name (a kernel belongs to the
        window it starts in). Not split by grid: only the main attention kernel's grids are
        used, and `main_pass` reads them from its launches."""
        out: list[list[KernelStat]] = [[] for _ in windows]
        if not windows or not self.has(KERNEL):
            return out
        n = len(windows)
        with closing(self._connect()) as con:
            con.execute(
                "CREATE TEMP TABLE k (key INTEGER PRIMARY KEY, sn INTEGER, calls INTEGER, "
                "dur INTEGER)"
            )
            key = window_case(windows, f"demangledName * {n} + {{i}}", overlap=False)
            con.execute(
                f"""
                INSERT INTO temp.k (key, sn, calls, dur)
                SELECT {key}, shortName, 1, "end" - start
                FROM {KERNEL}
                WHERE start >= {min(w.lo for w in windows)} AND start < {max(w.hi for w in windows)}
                ON CONFLICT (key) DO UPDATE SET calls = calls + 1, dur = dur + excluded.dur
                """
            )
            rows = con.execute(
                f"SELECT key, sn, calls, dur FROM temp.k WHERE key != {NOWHERE}"
            ).fetchall()
        keyed = [(*divmod(int(k), n), int(sn), int(c), int(d)) for k, sn, c, d in rows]
        names = self.strings([r[0] for r in keyed] + [r[2] for r in keyed])
        for name, w, sn, calls, dur in keyed:
            out[w].append(KernelStat(name=names[sn], full=names[name], calls=calls, total_ns=dur))
        return out

    def main_pass(self, windows: Sequence[ResolvedWindow], query: MainQuery) -> MainPass:
        """The main attention kernel's launches in one read (servelab.profile.nsys_main)."""
        return main_pass(self, windows, query)
