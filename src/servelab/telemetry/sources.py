"""What the samplers read: CPU and memory through psutil, the CPU packages' energy through RAPL
(powercap), and the server's Prometheus /metrics (the server's GPUs through NVML:
servelab.telemetry.nvml).

Each source turns one reading into sample records (plain dicts): `source` (gpu, cpu, server,
rapl), `epoch_ns` (wall clock, so samples line up with request windows and profiler traces) and
values. A source that cannot run says why (`open()` returns the reason) and is recorded as
absent; a reading that fails mid-run becomes a record with an `error`, never a crash.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import psutil

if TYPE_CHECKING:
    from psutil._ntuples import pcputimes, scputimes

# a sample record: `source`, `epoch_ns` and what one reading gave (numbers, words, the RAPL
# zones' joules, a histogram, the GPUs' selection), written as one line of telemetry.jsonl
Sample = dict[str, object]


class Source(Protocol):
    name: str

    def open(self) -> str | None:
        """Prepare; return why this source cannot be sampled, or None."""
        ...

    def read(self) -> list[Sample]: ...

    def close(self) -> None: ...


# --- CPU and memory through psutil -----------------------------------------------------------

TREE_REFRESH_S = 2.0  # listing a process tree walks all of /proc: a few ms, so not every tick


def _cpu_s(times: pcputimes) -> float:
    return float(times.user + times.system)


class ProcessTree:
    """A process and its descendants, their CPU seconds summed since sampling began (a process
    that starts later counts from zero; one already there from its first reading) and their
    resident memory; the list of descendants is refreshed every TREE_REFRESH_S."""

    def __init__(self, root: psutil.Process, opened_epoch_s: float) -> None:
        self.root = root
        self.opened_epoch_s = opened_epoch_s
        self._tree: dict[int, psutil.Process] = {}
        self._seen: dict[int, float] = {}
        self.total = 0.0
        self._tree_at = 0.0
        self._refresh(time.monotonic(), first=True)

    def _refresh(self, now: float, first: bool = False) -> None:
        procs = [self.root]
        try:
            procs += self.root.children(recursive=True)
        except psutil.Error:
            pass
        tree = {p.pid: self._tree.get(p.pid, p) for p in procs}
        for pid, p in tree.items():
            if pid in self._seen:
                continue
            try:
                base = 0.0
                if first or p.create_time() < self.opened_epoch_s:
                    base = _cpu_s(p.cpu_times())
                self._seen[pid] = base
            except psutil.Error:
                continue
        self._tree = tree
        self._tree_at = now

    def reading(self, now: float) -> tuple[float, int, int]:
        """(CPU seconds so far, resident bytes, processes alive); 0 processes: all gone."""
        if now - self._tree_at >= TREE_REFRESH_S:
            self._refresh(now)
        rss = alive = 0
        for pid, p in list(self._tree.items()):
            try:
                with p.oneshot():
                    cpu = _cpu_s(p.cpu_times())
                    rss += int(p.memory_info().rss)
            except psutil.Error:
                self._tree.pop(pid, None)
                continue
            alive += 1
            self.total += max(0.0, cpu - self._seen.get(pid, cpu))
            self._seen[pid] = cpu
        return self.total, rss, alive

    def close(self) -> None:
        self._tree = {}


@dataclass(frozen=True)
class Beside:
    """The processes beside the server that a point's CPU sample tells apart from contention:
    `siblings`, the roots of other servers kept up beside this one whose points alternate with
    its (sweep.repeats.slices), and `client`, another tool measuring the point instead of
    servelab's client (client.cross_check; None: servelab's own client, this process)."""

    siblings: tuple[int, ...] = ()
    client: int | None = None


ALONE = Beside()  # nothing beside the server but servelab's own client


class HostSource:
    """The server's process tree, the client process and the host, each on its own.

    CPU is cumulative seconds since the source opened (`*_cpu_s`) and the percent of one core
    over the interval since the previous sample (`*_cpu_pct`, null on the first sample); the
    host's `host_cpu_pct` (busy, steal included) and `host_steal_pct` (hypervisor steal, null
    where the platform reports none) are of all cores. The client is this process less the
    samplers' own threads (`telemetry_cpu_*`), which `own_cpu_s` reports. `beside.siblings`:
    the process trees of other servers this run keeps up beside the point's, summed as
    `siblings_cpu_*`, so that the host's busy time they take is known rather than read as
    contention. `beside.client`: another tool measuring the point instead of servelab's client:
    its process tree is the client, and the samplers' own CPU stays in `telemetry_cpu_*`.
    """

    name = "cpu"

    def __init__(
        self,
        server_pid: int | str | None,
        own_cpu_s: Callable[[], float],
        beside: Beside = ALONE,
    ) -> None:
        # a string: why the server's processes cannot be sampled (a remote endpoint)
        self.server_pid = server_pid
        self.client_pid = beside.client
        self._tool: ProcessTree | None = None
        self.own_cpu_s = own_cpu_s
        self.sibling_pids = beside.siblings
        self._client = psutil.Process(os.getpid())
        self._server: ProcessTree | None = None
        self._siblings: list[ProcessTree] = []
        self._client0 = 0.0
        self._client_cpu = 0.0
        self._own0 = 0.0
        self._prev: tuple[float, ...] | None = None
        self._host_prev: scputimes | None = None
        self._server_error: str | None = None

    def open(self) -> str | None:
        opened = time.time()
        self._client0 = _cpu_s(self._client.cpu_times())
        self._client_cpu = 0.0
        self._own0 = self.own_cpu_s()
        if self.client_pid is not None:
            try:
                self._tool = ProcessTree(psutil.Process(self.client_pid), opened)
            except psutil.Error:
                return f"client process {self.client_pid} is gone"
        for pid in self.sibling_pids:
            try:
                self._siblings.append(ProcessTree(psutil.Process(pid), opened))
            except psutil.Error:
                continue  # a sibling gone: its CPU is no longer on the host
        if self.server_pid is None or isinstance(self.server_pid, str):
            self._server_error = self.server_pid or "no server process given"
            return None
        try:
            self._server = ProcessTree(psutil.Process(self.server_pid), opened)
        except psutil.Error:
            self._server_error = f"server process {self.server_pid} is gone"
        return None

    def _server_reading(self, now: float) -> tuple[float | None, int | None, int]:
        if self._server is None:
            return None, None, 0
        total, rss, alive = self._server.reading(now)
        if not alive:
            self._server_error = f"server process {self.server_pid} is gone"
            return None, None, 0
        return total, rss, alive

    def read(self) -> list[Sample]:
        epoch_ns = time.time_ns()
        now = time.monotonic()
        server_cpu, server_rss, nprocs = self._server_reading(now)
        own = self.own_cpu_s() - self._own0
        if self._tool is not None:
            client_total, client_rss, _ = self._tool.reading(now)
            self._client_cpu = max(self._client_cpu, client_total)
        else:
            with self._client.oneshot():
                client_total = _cpu_s(self._client.cpu_times()) - self._client0
                client_rss = int(self._client.memory_info().rss)
            # psutil counts the process in clock ticks (10 ms), the samplers' own CPU in ns:
            # their difference can step back by a tick's fraction, a counter must not
            self._client_cpu = max(self._client_cpu, client_total - own)
        client_cpu = self._client_cpu
        host = psutil.cpu_times()
        mem = psutil.virtual_memory()
        rec: Sample = {
            "source": "cpu",
            "epoch_ns": epoch_ns,
            "server_cpu_s": server_cpu,
            "server_rss_bytes": server_rss,
            "server_procs": nprocs,
            "client_cpu_s": client_cpu,
            "client_rss_bytes": client_rss,
            "telemetry_cpu_s": own,
            "host_cpus": psutil.cpu_count() or 1,
            "host_cpu_pct": _host_busy_pct(self._host_prev, host),
            "host_steal_pct": _host_steal_pct(self._host_prev, host),
            "host_mem_used_bytes": int(mem.used),
            "host_mem_pct": float(mem.percent),
        }
        self._host_prev = host
        pairs = [("server_cpu_pct", server_cpu), ("client_cpu_pct", client_cpu)]
        pairs.append(("telemetry_cpu_pct", own))
        if self._siblings:
            siblings = sum(t.reading(now)[0] for t in self._siblings)
            rec["siblings_cpu_s"] = siblings
            pairs.append(("siblings_cpu_pct", siblings))
        prev = self._prev
        cur = (now, *(v if v is not None else -1.0 for _, v in pairs))
        for i, (key, _) in enumerate(pairs, start=1):
            ok = prev is not None and cur[0] > prev[0] and prev[i] >= 0 and cur[i] >= 0
            rec[key] = 100.0 * (cur[i] - prev[i]) / (cur[0] - prev[0]) if ok and prev else None
        self._prev = cur
        if self._server_error is not None:
            rec["server_error"] = self._server_error
        return [rec]

    def close(self) -> None:
        for tree in [self._server, self._tool, *self._siblings]:
            if tree is not None:
                tree.close()


def _host_busy_pct(before: scputimes | None, after: scputimes) -> float | None:
    if before is None:
        return None
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (
        before.idle + getattr(before, "iowait", 0.0)
    )
    total = sum(after) - sum(before)
    if total <= 0:
        return None
    return float(max(0.0, min(100.0, 100.0 * (1.0 - idle / total))))


def _host_steal_pct(before: scputimes | None, after: scputimes) -> float | None:
    """Hypervisor steal (time a virtual CPU was ready to run while the hypervisor ran something
    else) as % of all cores over the interval, over the same total as `_host_busy_pct`, which
    counts it as busy. Null on the first sample and where the platform reports no steal
    (psutil has `steal` on Linux only)."""
    if before is None or not hasattr(after, "steal") or not hasattr(before, "steal"):
        return None
    total = sum(after) - sum(before)
    if total <= 0:
        return None
    return float(max(0.0, min(100.0, 100.0 * (after.steal - before.steal) / total)))


# --- CPU package energy through RAPL (powercap) ---------------------------------------------

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")  # top-level zones; intel-rapl:0:0 are sub-zones


@dataclass
class _Zone:
    name: str
    path: Path
    max_uj: int | None
    last_uj: int
    total_j: float = 0.0


class RaplSource:
    """The CPU packages' energy counters (RAPL, read through Linux's powercap sysfs:
    `intel-rapl:<N>/energy_uj`, also on AMD): joules since the source opened, per package and
    in all, corrected for wrap-around (`max_energy_range_uj`). `root` replaces
    /sys/class/powercap (tests). The counters are of the whole packages, not of one process.
    """

    name = "rapl"

    def __init__(self, root: Path | None = None) -> None:
        self.root = POWERCAP if root is None else root
        self.zones: list[_Zone] = []

    def open(self) -> str | None:
        if not self.root.is_dir():
            return f"no {self.root} (no powercap RAPL driver on this host)"
        try:
            dirs = sorted(p for p in self.root.iterdir() if _PACKAGE_ZONE.match(p.name))
        except OSError as exc:
            return f"cannot list {self.root}: {exc.strerror or exc}"
        zones: list[_Zone] = []
        for d in dirs:
            try:
                name = (d / "name").read_text(encoding="utf-8").strip()
            except OSError:
                name = d.name
            if not name.startswith("package"):
                continue  # psys and the like: not a CPU package
            counter = d / "energy_uj"
            try:
                uj = int(counter.read_text(encoding="utf-8"))
            except PermissionError:
                return (
                    f"permission denied reading {counter} (the RAPL counters are readable by "
                    "root only on most kernels since 2020)"
                )
            except (OSError, ValueError) as exc:
                return f"cannot read {counter}: {exc}"
            try:
                max_uj: int | None = int((d / "max_energy_range_uj").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                max_uj = None
            zones.append(_Zone(name, d, max_uj, uj))
        if not zones:
            return f"no RAPL package zone (intel-rapl:<N> named package-<N>) in {self.root}"
        self.zones = zones
        return None

    def read(self) -> list[Sample]:
        rec: Sample = {"source": "rapl", "epoch_ns": time.time_ns()}
        errors: list[str] = []
        for z in self.zones:
            try:
                uj = int((z.path / "energy_uj").read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                errors.append(f"{z.name}: {exc}")
                continue
            step = uj - z.last_uj
            if step < 0:  # the counter wrapped: it runs from 0 to max_energy_range_uj
                if not z.max_uj:
                    errors.append(f"{z.name}: the counter went back and has no range to wrap")
                    z.last_uj = uj
                    continue
                step += z.max_uj
            z.total_j += step / 1e6
            z.last_uj = uj
        rec["zones"] = {z.name: round(z.total_j, 6) for z in self.zones}
        # a zone that could not be read catches up on its next reading: until then the total
        # is short, so it is not given
        rec["energy_j"] = None if errors else round(sum(z.total_j for z in self.zones), 6)
        if errors:
            rec["error"] = "; ".join(errors)[:300]
        return [rec]

    def close(self) -> None:
        self.zones = []


# --- the server's Prometheus /metrics ----------------------------------------------------------

# servelab name -> (kind, vLLM family names, newest first; older vLLM releases used the others)
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge_sum", ("vllm:num_requests_running",)),
    "waiting": ("gauge_sum", ("vllm:num_requests_waiting",)),
    "kv_cache_usage": ("gauge_max", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "preemptions_total": ("counter", ("vllm:num_preemptions",)),
    "generation_tokens_total": ("counter", ("vllm:generation_tokens",)),
    "prompt_tokens_total": ("counter", ("vllm:prompt_tokens",)),
    "ttft_s": ("histogram", ("vllm:time_to_first_token_seconds",)),
    "itl_s": (
        "histogram",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    "queue_s": ("histogram", ("vllm:request_queue_time_seconds",)),
    # in tokens: prompt tokens looked up in the prefix cache, and those found there
    "prefix_cache_queries_total": ("counter", ("vllm:prefix_cache_queries",)),
    "prefix_cache_hits_total": ("counter", ("vllm:prefix_cache_hits",)),
    # requests finished, whatever the reason (stop, length, abort, error, ...)
    "requests_finished_total": ("counter", ("vllm:request_success",)),
}
_SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")
_KEEP = frozenset(
    fam + suffix for _, fams in METRICS.values() for fam in fams for suffix in _SUFFIXES
)


def _wanted_lines(text: str) -> str:
    """Only the lines of the families servelab reads: the parser then reads ~110 lines, not ~640.

    This is the bulk of a scrape's cost, and the samplers must stay out of the measurement.
    """
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _KEEP:
                keep.append(line)
            continue
        end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < end:
                end = i
        if line[:end] in _KEEP:
            keep.append(line)
    return "\n".join(keep) + "\n"


class Histogram(TypedDict):
    """A server histogram as one scrape reads it: its count, its sum and its cumulative
    buckets ([finite upper bound, count])."""

    count: float
    sum: float
    buckets: list[list[float]]


def parse_metrics(text: str) -> dict[str, float | Histogram | None]:
    """The values servelab records from one /metrics scrape, parsed with prometheus_client.

    Gauges of several engines (data parallel) add up (running, waiting) or take the largest
    (KV usage, a fraction 0-1); counters and histograms add up. A series the server does not
    export is null. Histograms are {count, sum, buckets: [[upper bound, cumulative count]]},
    finite bounds only (the +Inf bucket equals count).
    """
    from prometheus_client.parser import text_string_to_metric_families

    # A family's samples, by name. A counter declared without its suffix (`# TYPE x counter`
    # over samples `x_total`, as prometheus_client's OpenMetrics writer has it) leaves the
    # text parser an empty family `x` and one untyped family `x_total` per sample: gather them.
    families: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(_wanted_lines(text)):
        families.setdefault(fam.name, []).extend(fam.samples)
    out: dict[str, float | Histogram | None] = {}
    for key, (kind, names) in METRICS.items():
        samples = next(
            (families[n] for n in names + tuple(n + "_total" for n in names) if families.get(n)),
            None,
        )
        if samples is None:
            out[key] = None
            continue
        if kind == "histogram":
            buckets: dict[float, float] = {}
            count = total = 0.0
            for s in samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    if math.isfinite(le):  # the +Inf bucket is `count`; JSON has no Infinity
                        buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
            out[key] = {
                "count": count,
                "sum": total,
                "buckets": [[le, n] for le, n in sorted(buckets.items())],
            }
            continue
        values = [s.value for s in samples if not s.name.endswith("_created")]
        if not values:
            out[key] = None
        elif kind == "gauge_max":
            out[key] = max(values)
        else:
            out[key] = sum(values)
    return out


class ServerMetricsSource:
    """Scrapes `<base_url>/metrics` over one kept-alive connection.

    A sample's time is the middle of its scrape; a failed scrape is a record with an `error`.
    """

    name = "server"

    def __init__(self, base_url: str | None, timeout_s: float, path: str = "/metrics"):
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.path = path
        self._conn: http.client.HTTPConnection | None = None

    def open(self) -> str | None:
        if not self.base_url:
            return "no server URL given"
        import prometheus_client.parser  # noqa: F401 - imported here, not during the point

        url = urllib.parse.urlsplit(self.base_url)
        if url.scheme != "http" or not url.hostname:
            return f"cannot scrape {self.base_url}: only http://host:port is supported"
        self._host, self._port = url.hostname, url.port or 80
        return None

    def _get(self) -> str:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        self._conn.request("GET", self.path)
        resp = self._conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status} from {self.base_url}{self.path}")
        return body.decode("utf-8", "replace")

    def read(self) -> list[Sample]:
        t0 = time.time_ns()
        try:
            text = self._get()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            msg = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
            return [{"source": "server", "epoch_ns": t0, "error": msg[:300]}]
        t1 = time.time_ns()
        try:
            values = parse_metrics(text)
        except ValueError as exc:
            return [{"source": "server", "epoch_ns": t0, "error": f"unparsable /metrics: {exc}"}]
        return [
            {
                "source": "server",
                "epoch_ns": (t0 + t1) // 2,
                "scrape_ms": (t1 - t0) / 1e6,
                **values,
            }
        ]

    def read_closing(self) -> list[Sample]:
        """The closing sample, once the server's counters have settled.

        vLLM adds a step's tokens and finished requests to its counters just after it has
        streamed them, in the same update that sets its running gauge, so a scrape right after
        the client's last token can be one step short (16 of 256 tokens were seen) and then
        still shows requests running. Scrape again, SETTLE_GAP_S apart, until none runs, for
        at most SETTLE_S (a shared endpoint busy with other traffic never settles); the last
        scrape is the sample."""
        out = self.read()
        deadline = time.monotonic() + SETTLE_S
        while not _settled(out) and time.monotonic() < deadline:
            time.sleep(SETTLE_GAP_S)
            out = self.read()
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


SETTLE_S = 1.0
SETTLE_GAP_S = 0.05


def _settled(samples: list[Sample]) -> bool:
    """A scrape that read and shows no request running (or no such gauge)."""
    rec = samples[-1]
    return "error" not in rec and not rec.get("running")
