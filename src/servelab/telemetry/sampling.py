"""Background samplers around one measured point, and the `telemetry.jsonl` they leave.

Each source runs in its own daemon thread on its own clock (ticks at a fixed rate, late ticks
skipped, never bunched). Starting waits for every sampler's first sample and stopping takes one
last sample, so the samples bracket the point: counters (tokens, preemptions, CPU seconds) are
read as the difference across the point. The samplers keep their own CPU time, which the CPU
source reports (`telemetry_cpu_*`) and subtracts from the client's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from servelab.documents import JsonObject
from servelab.documents.declared import TelemetryJson
from servelab.env.endpoint import REMOTE
from servelab.errors import ServelabError
from servelab.experiment import TelemetrySection
from servelab.store.jsonio import DamagedFile, dumps, json_object_line, write_atomic
from servelab.store.paths import TELEMETRY_FILE
from servelab.telemetry.gpus import GpuSelection
from servelab.telemetry.nvml import GpuSource
from servelab.telemetry.sources import (
    ALONE,
    Beside,
    HostSource,
    RaplSource,
    Sample,
    ServerMetricsSource,
    Source,
)
from servelab.telemetry.summary import summarize

FILE_NAME = TELEMETRY_FILE
SOURCE_ORDER = {"gpu": 0, "cpu": 1, "server": 2, "rapl": 3}
# the sources that read this host's hardware as the server's: not for a server elsewhere
SERVER_HARDWARE = ("gpu", "rapl")


class Sampler:
    """One source, sampled at `hz` in a daemon thread until stopped."""

    def __init__(self, source: Source, hz: float) -> None:
        self.source = source
        self.period_s = 1.0 / hz
        self.samples: list[Sample] = []
        self.cpu_s = 0.0  # this thread's own CPU time, updated after each tick
        self.first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"servelab-telemetry-{source.name}", daemon=True
        )

    def _tick(self, closing: bool = False) -> None:
        # a source may take its closing sample its own way (the server's counters settle)
        read = getattr(self.source, "read_closing", self.source.read) if closing else None
        try:
            self.samples.extend(read() if read else self.source.read())
        except Exception as exc:  # a sampler never takes the measurement down with it
            msg = f"{type(exc).__name__}: {exc}"[:300]
            self.samples.append(
                {"source": self.source.name, "epoch_ns": time.time_ns(), "error": msg}
            )
        self.cpu_s = time.thread_time()

    def _run(self) -> None:
        next_t = time.monotonic()
        self._tick()
        self.first.set()
        while True:
            now = time.monotonic()
            while next_t <= now:
                next_t += self.period_s
            if self._stop.wait(next_t - now):
                break
            self._tick()
        self._tick(closing=True)  # the closing sample, after the point

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout_s: float) -> bool:
        """Stop after the closing sample; False when the thread is still stuck in a read.
        A sampler that never started (the point was interrupted while starting them) is
        stopped already."""
        self._stop.set()
        if self._thread.ident is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


@dataclass(frozen=True)
class HostAccess:
    """Where the samplers read the host's hardware: `nvml` replaces the pynvml module and
    `powercap_root` /sys/class/powercap (None: the real ones); tests give fakes."""

    nvml: Any = None
    powercap_root: Path | None = None


class PointTelemetry:
    """Samplers running alongside one point; use as a context manager around the point.

        tel = PointTelemetry(exp.telemetry, server_pid, base_url)
        with tel:
            run_point(...)
        summary = tel.finish(point_dir, started_epoch_ns, finished_epoch_ns, output_tokens)

    `finish` writes telemetry.jsonl (whatever was sampled, also for a point cut short) and
    returns the point's summary. `server_pid` is the root of the server's process tree, or,
    where the server's processes cannot be sampled, why (a string): a server on another host
    (servelab.env.endpoint.REMOTE) then has no server CPU, and this host's GPUs and CPU packages
    (RAPL) are not sampled as its own: each is recorded absent with that reason. `settings`
    is the experiment's `telemetry:` section
    (`config.default_section(TelemetrySection, "telemetry")` without one); `gpus` the server's
    GPUs (servelab.telemetry.gpus.server_gpus; None: every GPU NVML lists), the only ones
    sampled; `host` (tests) replaces the pynvml module and /sys/class/powercap (`HostAccess`).
    The CPU packages' energy (RAPL) is sampled at `cpu_hz`. `beside`: the processes beside the
    server the CPU sample tells apart (sources.Beside: other servers whose points alternate
    with its, another tool measuring the point instead of servelab's client).
    """

    def __init__(
        self,
        settings: TelemetrySection,
        server_pid: int | str | None,
        base_url: str | None,
        gpus: GpuSelection | None = None,
        beside: Beside = ALONE,
        host: HostAccess | None = None,
    ) -> None:
        self.settings = settings
        self.beside = beside
        host = host or HostAccess()
        nvml, powercap_root = host.nvml, host.powercap_root
        self.enabled = settings.enabled
        self.server_pid = server_pid
        self.base_url = base_url
        self.nvml = nvml
        self.gpus = gpus
        self.powercap_root = powercap_root
        self.samplers: list[Sampler] = []
        self.absent: list[Sample] = []
        self._sources: list[Source] = []
        self._started = False

    @property
    def remote(self) -> str | None:
        """Why the server's hardware is not this host's (servelab.env.endpoint.REMOTE), if so."""
        reason = self.server_pid
        return REMOTE if reason == REMOTE else None

    def own_cpu_s(self) -> float:
        return sum(s.cpu_s for s in self.samplers)

    def start(self) -> None:
        if not self.enabled or self._started:
            return
        self._started = True
        sources: list[tuple[Source, float]] = [
            (GpuSource(self.nvml, self.gpus), float(self.settings.gpu_hz)),
            (
                HostSource(self.server_pid, self.own_cpu_s, self.beside),
                float(self.settings.cpu_hz),
            ),
            (
                ServerMetricsSource(self.base_url, float(self.settings.metrics_timeout_s)),
                float(self.settings.metrics_hz),
            ),
            (RaplSource(self.powercap_root), float(self.settings.cpu_hz)),
        ]
        for source, hz in sources:
            if self.remote is not None and source.name in SERVER_HARDWARE:
                absent: Sample = {"source": source.name, "epoch_ns": time.time_ns()}
                self.absent.append({**absent, "absent": self.remote})
                continue
            reason = source.open()
            # the GPUs' selection and what NVML made of it: one record, with the reason where
            # no GPU is sampled
            meta: Sample = {"selection": source.describe()} if isinstance(source, GpuSource) else {}
            if reason is not None:
                self.absent.append(
                    {"source": source.name, "epoch_ns": time.time_ns(), "absent": reason, **meta}
                )
                continue
            if meta:
                self.absent.append({"source": source.name, "epoch_ns": time.time_ns(), **meta})
            self._sources.append(source)
            self.samplers.append(Sampler(source, hz))
        for s in self.samplers:
            s.start()
        for s in self.samplers:  # the first samples come before the point
            s.first.wait(float(self.settings.metrics_timeout_s) + 1.0)

    def stop(self) -> None:
        for s in self.samplers:  # all at once: the closing samples are taken together
            s.request_stop()
        for s in self.samplers:
            # A thread stuck in a read (a hung scrape) is a daemon: it is left to finish on
            # its own, its source still open, and only what it sampled so far is kept.
            if s.stop(float(self.settings.metrics_timeout_s) + 1.0) and s.source in self._sources:
                s.source.close()
                self._sources.remove(s.source)

    def __enter__(self) -> PointTelemetry:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def samples(self) -> list[Sample]:
        rows = list(self.absent)
        for s in self.samplers:
            rows.extend(list(s.samples))
        return sort_samples(rows)

    def finish(
        self,
        point_dir: Path,
        started_epoch_ns: int,
        finished_epoch_ns: int,
        output_tokens: int | None = None,
    ) -> TelemetryJson:
        """Stop (if still running), write telemetry.jsonl into `point_dir`, return the summary;
        `output_tokens` (the point's `total_output_tokens`) gives its energy per output token."""
        if not self.enabled:
            return {"enabled": False}
        self.stop()
        rows = self.samples()
        write_samples(point_dir / FILE_NAME, rows)
        return summarize(rows, started_epoch_ns, finished_epoch_ns, output_tokens)


def _whole(value: object) -> int:
    """An integer field of a sample (`epoch_ns`, `device`) for ordering."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"a sample's {value!r} is not an integer")
    return int(value)


def sort_samples(rows: Sequence[Sample]) -> list[Sample]:
    return sorted(
        rows,
        key=lambda r: (
            _whole(r.get("epoch_ns", 0)),
            SOURCE_ORDER.get(str(r.get("source")), 9),
            _whole(r.get("device", -1)),
        ),
    )


def write_samples(path: Path, rows: Sequence[Sample]) -> None:
    """One JSON object per line, keys sorted, written atomically."""
    write_atomic(path, "".join(dumps(r, indent=None) + "\n" for r in rows))


# what to do about a damaged telemetry.jsonl: the point's summary (point.json `telemetry`) was
# computed from the samples when they were written, so only a new measurement brings them back
SAMPLES_TODO = "re-run the sweep of the point's server configuration to sample it again"


def read_samples(path: Path) -> list[JsonObject]:
    """The samples of a telemetry.jsonl, each checked as its readers use it (an object with a
    string `source` and an integer `epoch_ns`): DamagedFile naming the line and field
    otherwise."""
    rows: list[JsonObject] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServelabError(
            f"{path}: file not found; was the point measured with telemetry?"
        ) from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason}); {SAMPLES_TODO}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = json_object_line(path, lineno, line, SAMPLES_TODO)
        for key, kind, ok in (
            ("source", "a string", isinstance(row.get("source"), str)),
            ("epoch_ns", "an integer", type(row.get("epoch_ns")) is int),
        ):
            if not ok:
                what = "required field missing" if key not in row else f"{row[key]!r} is not {kind}"
                raise DamagedFile(path, f"line {lineno}: $.{key}", f"{what}; {SAMPLES_TODO}")
        rows.append(row)
    return rows
