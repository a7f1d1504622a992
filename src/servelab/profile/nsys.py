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
(after CUDA_VISIBLE_DEVICES); TARGET_INFO_CUDA_DEVICE(gpuId, cudaId, pid, ...) maps a
process's CUDA device to TARGET_INFO_GPU.id, and TARGET_INFO_GPU(id, name, ...) lists every
GPU of the host, used or not; CUPTI_ACTIVITY_KIND_RUNTIME(start, "end", globalTid,
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

vLLM's steps: with the CUDA profiler on (--profiler-config '{"profiler": "cuda"}'), vLLM's GPU
worker wraps every engine step in an NVTX push/pop range (vllm/profiler/wrapper.py:
CudaProfilerWrapper.annotate_context_manager is torch.cuda.nvtx.range; the name comes from
vllm/v1/worker/gpu_worker.py: annotate_profile) named
`execute_context_{N}({T})_generation_{M}({T2})`: N context requests (a prefill, or a chunk of
one) with T tokens, M generation (decode) requests with T2 tokens
(vllm/v1/utils.py: compute_iteration_details); with detailed annotation
`execute_{tokens}_context_{N}(sq{T}sk...)_generation_{M}(sq{T2}sk...)`; older releases name it
`execute_new_{N}_cached_{M}` (new requests, and requests already running: a cached request may
still be in a chunked prefill). The ranges are on the worker's thread, in host time; a step is
projected onto the GPU through the launches made inside it (correlationId).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.errors import ServelabError
from servelab.profile.forwards import ForwardGrouper
from servelab.profile.kernels import KernelStat
from servelab.profile.windows import ResolvedWindow, Window, to_trace_clock

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
# vLLM's per-step NVTX range names (see the module docstring), each with its format's name:
# groups are (context requests, context tokens, generation requests, generation tokens)
STEP_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "context/generation",
        re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$"),
    ),
    (
        "context/generation (detailed)",
        re.compile(r"^execute_\d+_context_(\d+)\(sq(\d+)[^)]*\)_generation_(\d+)\(sq(\d+)[^)]*\)$"),
    ),
    ("new/cached", re.compile(r"^execute_new_(\d+)_cached_(\d+)$")),
)


@dataclass(frozen=True)
class StepRange:
    """One engine step as vLLM's NVTX range names it, in host time on the worker's thread."""

    start: int
    end: int
    tid: int  # globalTid
    context: int  # requests in prefill (or "new", in the new/cached format)
    generation: int  # requests in decode (or "cached")
    context_tokens: int | None
    generation_tokens: int | None
    form: str

    @property
    def requests(self) -> int:
        return self.context + self.generation

    @property
    def kind(self) -> str:
        if self.context and self.generation:
            return "mixed"
        if self.context:
            return "prefill"
        return "decode" if self.generation else "empty"


def parse_step_range(name: str) -> tuple[str, int, int, int | None, int | None] | None:
    """(format, context requests, generation requests, context tokens, generation tokens) of
    a vLLM step range name, or None."""
    for form, pat in STEP_FORMATS:
        m = pat.match(name)
        if m is None:
            continue
        if form == "new/cached":
            return form, int(m.group(1)), int(m.group(2)), None, None
        return form, int(m.group(1)), int(m.group(3)), int(m.group(2)), int(m.group(4))
    return None


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

    def _device_map(self) -> tuple[str, dict[str, Any]]:
        """SQL for a kernel row's GPU (TARGET_INFO_GPU.id), and the record of how it was found:
        deviceId through TARGET_INFO_CUDA_DEVICE (per process when processes see their CUDA
        devices differently, e.g. one CUDA_VISIBLE_DEVICES per worker), else deviceId itself.
        A device missing from the table keeps its deviceId."""
        cols = self.columns(CUDA_DEVICE) if self.has(CUDA_DEVICE) else set()
        if not {"gpuId", "cudaId"} <= cols:
            return "deviceId", {"source": "deviceId", "cuda_devices": []}
        pid = "pid" if "pid" in cols else "NULL"
        rows = sorted(
            {
                (None if p is None else int(p), int(c), int(g))
                for p, c, g in self.con.execute(f"SELECT {pid}, cudaId, gpuId FROM {CUDA_DEVICE}")
                if c is not None and g is not None
            },
            key=lambda r: (r[0] is None, r[0] or 0, r[1], r[2]),
        )
        info = {
            "source": CUDA_DEVICE,
            "cuda_devices": [{"pid": p, "cuda_id": c, "gpu_id": g} for p, c, g in rows],
        }
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

    def info(self) -> dict[str, Any]:
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
        key = _window_case(windows, f"{self.gpu_expr} * {n} + {{i}}", overlap=True)
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
            f"SELECT key, busy, s0, e, disorder FROM temp.busy WHERE key != {_NOWHERE}"
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
            key = _window_case(windows, f"demangledName * {n} + {{i}}", overlap=False)
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
                f"SELECT key, sn, calls, dur FROM temp.k WHERE key != {_NOWHERE}"
            ).fetchall()
        keyed = [(*divmod(int(k), n), int(sn), int(c), int(d)) for k, sn, c, d in rows]
        names = self.strings([r[0] for r in keyed] + [r[2] for r in keyed])
        for name, w, sn, calls, dur in keyed:
            out[w].append(KernelStat(name=names[sn], full=names[name], calls=calls, total_ns=dur))
        return out

    def main_pass(self, windows: Sequence[ResolvedWindow], query: MainQuery) -> MainPass:
        """One read of the main attention kernel's launches (one row in a few): its calls and
        time per window and grid, each grid dimension's values, and, when the layer count is
        known, its forwards per window and GPU for each grid dimension in `query.dims` that
        may carry the population (the caller picks one once every value is seen). With
        several names (instantiations) and their labels, a launch's key carries its label
        after the grid; with `query.origins`, each forward records its first launch's
        (globalPid, correlationId). Rows are read as stored while each GPU's launches come
        in start order, else again, sorted."""
        res = MainPass([[] for _ in windows])
        if not windows or not query.full_names or not self.has(KERNEL):
            return res
        names = sorted(query.full_names)
        ids = {
            int(i): str(v)
            for i, v in self.con.execute(
                f"SELECT id, value FROM StringIds WHERE value IN ({','.join('?' * len(names))})",
                names,
            )
        }
        if not ids:
            return res
        labels = query.labels
        lab = {i: labels[v] for i, v in ids.items() if v in labels} if labels else {}
        if len(ids) < 2 or len(lab) != len(ids):
            lab = {}
        for ordered in (False, True):
            got = self._main_pass(windows, ids, lab, query, ordered)
            if got is not None:
                return got
        raise AssertionError("sorted launches came out of order")  # pragma: no cover

    def _main_launches(
        self,
        windows: Sequence[ResolvedWindow],
        ids: Mapping[int, str],
        origins: bool,
        ordered: bool,
    ) -> sqlite3.Cursor:
        """The main kernel's launches in the windows: window, name id, GPU, start, end, grid
        (and with `origins`, globalPid and correlationId); with `ordered`, sorted by GPU and
        start."""
        which = _window_case(windows, "{i}", overlap=False, outside="NULL")
        # one name (the usual case): its id is not read per row
        name = str(next(iter(ids))) if len(ids) == 1 else "n"
        outer, inner = (", p, c", ", globalPid AS p, correlationId AS c") if origins else ("", "")
        return self.con.execute(
            f"""SELECT w, {name}, d, s, e, gx, gy, gz{outer}
                FROM (SELECT {which} AS w, demangledName AS n, {self.gpu_expr} AS d,
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
        self,
        windows: Sequence[ResolvedWindow],
        ids: Mapping[int, str],
        lab: Mapping[int, str],
        query: MainQuery,
        ordered: bool,
    ) -> MainPass | None:
        """The main pass over the launches as read (`ordered`: sorted); None when a GPU's
        launches in a window come out of start order (then read again, sorted)."""
        cur = self._main_launches(windows, ids, query.origins, ordered)
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
_NOWHERE = -(2**62)


def _window_case(
    windows: Sequence[ResolvedWindow], then: str, overlap: bool, outside: str = str(_NOWHERE)
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
