"""A host-speed canary: a fixed, deterministic piece of work, timed.

Timed before and after a sweep, it tells a slower host from slower code: when the
canary moved beyond its own noise between two runs, the host changed.

- ``measure_cpu``: single-thread compute (a fixed integer loop, seconds, median and
  spread over k repeats) and memory bandwidth (copies of a fixed buffer, GB/s).
- ``drift(before, after)``: the relative change of each part and a verdict,
  "steady" or "moved", with the threshold used.
- ``RunCanary``: what a sweep job records in run.json `canary` (docs/raw-data.md): the CPU
  canary before its first server launch and after its last, and their drift; on a GPU runtime
  also the GPU canary's (hostfacts.gpucanary: a fixed matmul and a device copy through the
  runtime's PyTorch), or why it could not be timed; ``CanaryTimes`` takes them as the job goes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from servelab.documents.declared import (
    CpuCanaryJson,
    DriftJson,
    RunCanaryJson,
)
from servelab.hostfacts.gpucanary import GpuAbsent, GpuCanary, GpuMeasure, RunGpuCanary
from servelab.hostfacts.timing import (
    DRIFT_FLOOR,
    PartDrift,
    Timing,
    drift_line,
    overall,
    part_drift,
    summary,
)
from servelab.store.paths import ExperimentPaths
from servelab.store.records import DamagedRawData, RunRecord

Timer = Callable[[], float]

# Each repeat spans more than one 100 ms CFS period (a CPU quota's unit: a throttled host then
# slows every repeat, not some), and a timing takes ~0.7 s on a 2-vCPU AMD EPYC (Zen 4):
# 600,000 iterations (~170 ms) and 4 copies of 64 MiB (~50-100 ms) a repeat, 3 repeats each.
COMPUTE_ITERATIONS = 600_000
BUFFER_MIB = 64
COPIES = 4
REPEATS = 3
# The compute part runs on every CPU this process may use, up to MAX_WORKERS, at once: a server
# uses them all, so a host that gives fewer cycles (a CPU quota, another tenant on one core)
# slows it as it slows the server; one loop alone would run on whichever core is free.
MAX_WORKERS = 16


@dataclass(frozen=True)
class CpuCanary:
    """The CPU canary: compute seconds (lower is faster) and copy GB/s (higher is faster)."""

    compute: Timing
    bandwidth: Timing
    checksum: int
    iterations: int
    buffer_mib: int
    workers: int = 1  # loops run at once in the compute part

    def to_json(self) -> CpuCanaryJson:
        return {
            "compute": self.compute.to_json(),
            "bandwidth": self.bandwidth.to_json(),
            "checksum": self.checksum,
            "iterations": self.iterations,
            "buffer_mib": self.buffer_mib,
            "workers": self.workers,
        }

    @classmethod
    def from_json(cls, doc: CpuCanaryJson) -> CpuCanary:
        return cls(
            Timing.from_json(doc["compute"]),
            Timing.from_json(doc["bandwidth"]),
            int(doc["checksum"]),
            int(doc["iterations"]),
            int(doc["buffer_mib"]),
            int(doc.get("workers", 1)),
        )

    def medians(self) -> dict[str, float]:
        """{compute_s, copy_gbps}: the medians, as validity.json and provenance.json keep them."""
        return {"compute_s": self.compute.median, "copy_gbps": self.bandwidth.median}

    def line(self) -> str:
        """compute 85.2 ms, copy 5.01 GB/s: the medians, as progress lines and the summary
        print them."""
        return f"compute {self.compute.median * 1e3:.1f} ms, copy {self.bandwidth.median:.2f} GB/s"


def compute_work(iterations: int = COMPUTE_ITERATIONS) -> int:
    """The fixed single-thread work: an integer linear-congruential loop; its checksum."""
    x = 1
    acc = 0
    for _ in range(iterations):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        acc ^= x >> 17
    return acc


def workers_available() -> int:
    """The CPUs this process may run on (its affinity), at most MAX_WORKERS."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_WORKERS))


# A worker of the parallel compute part: compute_work's loop, timed by the parent. It warms up,
# says "ready", then runs the loop once per line on stdin and prints its checksum.
WORKER = """
import sys
def work(n):
    x = 1
    acc = 0
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        acc ^= x >> 17
    return acc
n = int(sys.argv[1])
work(n // 10)
print("ready", flush=True)
for _ in sys.stdin:
    print(work(n), flush=True)
"""


def _time_compute(
    iterations: int, repeats: int, timer: Timer, workers: int = 1
) -> tuple[Timing, int]:
    """Seconds for `workers` loops at once (the wall until the last is done), `repeats` times;
    one worker runs in this process."""
    if workers > 1:
        return _time_parallel(iterations, repeats, timer, workers)
    seconds: list[float] = []
    checksum = compute_work(iterations // 10)  # untimed: the loop's code and data warm
    for _ in range(repeats):
        start = timer()
        checksum = compute_work(iterations)
        seconds.append(timer() - start)
    return summary(seconds, "s"), checksum


def _time_parallel(iterations: int, repeats: int, timer: Timer, workers: int) -> tuple[Timing, int]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(iterations)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    try:
        for proc in procs:  # started and warm before anything is timed
            assert proc.stdout is not None
            said = proc.stdout.readline().strip()
            if said != "ready":
                raise RuntimeError(f"a canary worker did not start: it said {said!r}")
        seconds: list[float] = []
        sums: set[int] = set()
        for _ in range(repeats):
            start = timer()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            for proc in procs:
                assert proc.stdout is not None
                sums.add(int(proc.stdout.readline()))
            seconds.append(timer() - start)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    if len(sums) != 1:
        raise RuntimeError(f"canary workers disagree on the checksum: {sorted(sums)}")
    return summary(seconds, "s"), sums.pop()


def _time_bandwidth(buffer_mib: int, repeats: int, timer: Timer) -> Timing:
    size = buffer_mib * 1024 * 1024
    source = memoryview(bytearray(size))
    target = memoryview(bytearray(size))
    target[:] = source  # untimed: the first copy faults the target's pages in
    rates: list[float] = []
    for _ in range(repeats):
        start = timer()
        for _ in range(COPIES):
            target[:] = source
        elapsed = max(timer() - start, 1e-9)
        rates.append(COPIES * size / elapsed / 1e9)
    return summary(rates, "GB/s")


def measure_cpu(
    iterations: int = COMPUTE_ITERATIONS,
    buffer_mib: int = BUFFER_MIB,
    repeats: int = REPEATS,
    timer: Timer = time.perf_counter,
    workers: int | None = None,
) -> CpuCanary:
    """Time the fixed compute work on `workers` CPUs at once (None: workers_available()) and
    the buffer copies, ``repeats`` times each."""
    workers = workers_available() if workers is None else workers
    compute, checksum = _time_compute(iterations, repeats, timer, workers)
    bandwidth = _time_bandwidth(buffer_mib, repeats, timer)
    return CpuCanary(compute, bandwidth, checksum, iterations, buffer_mib, workers)


@dataclass(frozen=True)
class Drift:
    """Whether the canary moved between two measurements beyond its own noise."""

    compute: PartDrift
    bandwidth: PartDrift
    verdict: str

    def to_json(self) -> DriftJson:
        return {
            "compute": self.compute.to_json(),
            "bandwidth": self.bandwidth.to_json(),
            "verdict": self.verdict,
        }

    @classmethod
    def from_json(cls, doc: DriftJson) -> Drift:
        return cls(
            PartDrift.from_json(doc["compute"]),
            PartDrift.from_json(doc["bandwidth"]),
            str(doc["verdict"]),
        )

    def line(self) -> str:
        """steady (compute +1.2%, copy -3.0%; beyond 5.0% and 7.5% it moved), or unsteady
        (...) when a part's repeats spread too wide to judge."""
        return drift_line({"compute": self.compute, "copy": self.bandwidth}, self.verdict)


def drift(before: CpuCanary, after: CpuCanary, floor: float = DRIFT_FLOOR) -> Drift:
    """A part moved when its change exceeds the larger of 3x the mean relative spread of the
    two timings and ``floor``; short of that, it is unsteady when either timing's own spread
    exceeds UNSTEADY_SPREAD (too noisy to call it steady). The canary moved when a part moved,
    else is unsteady when a part is (hostfacts.timing.part_drift)."""
    compute = part_drift(before.compute, after.compute, True, floor)
    bandwidth = part_drift(before.bandwidth, after.bandwidth, False, floor)
    return Drift(compute, bandwidth, overall(compute, bandwidth))


@dataclass(frozen=True)
class RunCanary:
    """run.json `canary`: the CPU canary timed before a sweep job's first server launch and
    after its last, and whether the host's speed moved between them beyond its own noise; on
    a GPU runtime, `gpu`: the GPU canary's (hostfacts.gpucanary), or why it was not timed."""

    before: CpuCanary
    after: CpuCanary
    drift: Drift
    gpu: RunGpuCanary | None = None

    def to_json(self) -> RunCanaryJson:
        out: RunCanaryJson = {
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "drift": self.drift.to_json(),
        }
        if self.gpu is not None:  # absent on a CPU runtime, never null
            out["gpu"] = self.gpu.to_json()
        return out

    @classmethod
    def from_json(cls, doc: RunCanaryJson) -> RunCanary:
        gpu = doc.get("gpu")
        return cls(
            CpuCanary.from_json(doc["before"]),
            CpuCanary.from_json(doc["after"]),
            Drift.from_json(doc["drift"]),
            None if gpu is None else RunGpuCanary.from_json(gpu),
        )

    @property
    def verdict(self) -> str:
        """The CPU canary's drift, or the GPU canary's where it is worse (moved, then
        unsteady, then steady)."""
        gpu = self.gpu.drift if self.gpu is not None else None
        if gpu is None:
            return self.drift.verdict
        return next(
            (v for v in ("moved", "unsteady") if v in (self.drift.verdict, gpu.verdict)),
            "steady",
        )


@dataclass
class CanaryTimes:
    """The canary as a sweep job takes it: before its first launch, after each launch (the
    last one counts); `measure` is measure_cpu, or a stand-in in a test. On a GPU runtime each
    call is given how to time the GPU canary in the runtime (servelab.launch.canary)."""

    measure: Callable[[], CpuCanary] = measure_cpu
    first: CpuCanary | None = None
    last: CpuCanary | None = None
    gpu_first: GpuCanary | GpuAbsent | None = None
    gpu_last: GpuCanary | GpuAbsent | None = None

    def before_launch(self, gpu: GpuMeasure | None = None) -> list[str] | None:
        """Time it before the job's first launch, and the GPU canary with `gpu`: the lines
        that say what it found; None (not timed again) before a later launch."""
        if self.first is not None:
            return None
        self.first = self.measure()
        if gpu is not None:
            self.gpu_first = gpu()
        return [self.first.line(), *_gpu_lines(self.gpu_first)]

    def after_launch(self, gpu: GpuMeasure | None = None) -> list[str]:
        """Time it after a launch (the last one's counts): the lines that say what it found."""
        self.last = self.measure()
        if gpu is None:
            return [self.last.line()]
        self.gpu_last = gpu()
        if self.gpu_last == self.gpu_first:  # absent for the same reason: said once
            return [self.last.line()]
        return [self.last.line(), *_gpu_lines(self.gpu_last)]

    def record(self) -> RunCanary | None:
        """The job's canary; None when it launched nothing (every point already complete)."""
        if self.first is None or self.last is None:
            return None
        gpu = None
        if self.gpu_first is not None or self.gpu_last is not None:
            none = GpuAbsent("not timed")
            gpu = RunGpuCanary.of(self.gpu_first or none, self.gpu_last or none)
        return RunCanary(self.first, self.last, drift(self.first, self.last), gpu)


def _gpu_lines(found: GpuCanary | GpuAbsent | None) -> list[str]:
    if found is None:
        return []
    if isinstance(found, GpuAbsent):
        return [f"GPU canary not timed ({found.reason}); the sweep goes on without it"]
    return [found.line()]


def run_canaries(paths: ExperimentPaths, skip_damaged: bool = False) -> dict[str, RunCanary]:
    """Each server configuration's run.json `canary` (read through RunRecord, so checked
    against its schema), by configuration; none for runs written before it was recorded. A
    damaged run.json raises, or with `skip_damaged` is passed over (the analysis reports it
    with the sweep's record)."""
    out: dict[str, RunCanary] = {}
    for rj in paths.run_files():
        try:
            doc = RunRecord.read(rj).canary
        except DamagedRawData:
            if not skip_damaged:
                raise
            continue
        if doc is not None:
            # RunRecord.read checked it against run.schema.json
            out[rj.parent.name] = RunCanary.from_json(cast(RunCanaryJson, doc))
    return out
