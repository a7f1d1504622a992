"""A host-speed canary: a fixed, deterministic piece of work, timed.

Timed before and after a sweep, it tells a slower host from slower code: when the
canary moved beyond its own noise between two runs, the host changed.

- ``measure_cpu``: single-thread compute (a fixed integer loop, seconds, median and
  spread over k repeats) and memory bandwidth (copies of a fixed buffer, GB/s).
- ``drift(before, after)``: the relative change of each part and a verdict,
  "steady" or "moved", with the threshold used.
- ``measure_gpu``: a fixed matmul and a device copy through PyTorch with CUDA; where
  either is missing, an absent result with the reason.
- ``RunCanary``: what a sweep job records in run.json `canary` (docs/raw-data.md): the CPU
  canary before its first server launch and after its last, and their drift; ``CanaryTimes``
  takes them as the job goes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

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
DRIFT_FLOOR = 0.05
NOISE_FACTOR = 3.0
# a part whose own repeats spread wider than this ((max - min) / median) says the host's speed
# varied while the canary ran: its drift cannot be judged ("unsteady"), and that is itself noted
UNSTEADY_SPREAD = 0.25


class TimingJson(TypedDict):
    unit: str
    median: float
    low: float
    high: float
    repeats: int


class CpuCanaryJson(TypedDict):
    compute: TimingJson
    bandwidth: TimingJson
    checksum: int
    iterations: int
    buffer_mib: int
    workers: int


class GpuCanaryJson(TypedDict):
    present: bool
    reason: str
    matmul: TimingJson | None
    copy: TimingJson | None


class PartDriftJson(TypedDict):
    change: float
    threshold: float
    verdict: str


class DriftJson(TypedDict):
    compute: PartDriftJson
    bandwidth: PartDriftJson
    verdict: str


class RunCanaryJson(TypedDict):
    """run.json's `canary`."""

    before: CpuCanaryJson
    after: CpuCanaryJson
    drift: DriftJson


@dataclass(frozen=True)
class Timing:
    """k repeats of one part: median, min and max, in ``unit``."""

    unit: str
    median: float
    low: float
    high: float
    repeats: int

    @property
    def relative_spread(self) -> float:
        """(max - min) / median: the part's own noise."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def to_json(self) -> TimingJson:
        return {
            "unit": self.unit,
            "median": self.median,
            "low": self.low,
            "high": self.high,
            "repeats": self.repeats,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Timing:
        return cls(
            str(doc["unit"]),
            float(doc["median"]),
            float(doc["low"]),
            float(doc["high"]),
            int(doc["repeats"]),
        )


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
    def from_json(cls, doc: Mapping[str, Any]) -> CpuCanary:
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


@dataclass(frozen=True)
class GpuCanary:
    """The GPU canary, or its absence with the reason."""

    present: bool
    reason: str
    matmul: Timing | None = None
    copy: Timing | None = None

    def to_json(self) -> GpuCanaryJson:
        return {
            "present": self.present,
            "reason": self.reason,
            "matmul": None if self.matmul is None else self.matmul.to_json(),
            "copy": None if self.copy is None else self.copy.to_json(),
        }


def compute_work(iterations: int = COMPUTE_ITERATIONS) -> int:
    """The fixed single-thread work: an integer linear-congruential loop; its checksum."""
    x = 1
    acc = 0
    for _ in range(iterations):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        acc ^= x >> 17
    return acc


def _summary(values: list[float], unit: str) -> Timing:
    return Timing(unit, statistics.median(values), min(values), max(values), len(values))


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
    return _summary(seconds, "s"), checksum


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
    return _summary(seconds, "s"), sums.pop()


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
    return _summary(rates, "GB/s")


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
class PartDrift:
    """One part's relative change (positive: the host got slower) and its verdict: moved
    (beyond `threshold`), else unsteady (its own repeats spread beyond UNSTEADY_SPREAD before
    or after: too noisy to call steady), else steady."""

    change: float
    threshold: float
    verdict: str

    def to_json(self) -> PartDriftJson:
        return {"change": self.change, "threshold": self.threshold, "verdict": self.verdict}


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
    def from_json(cls, doc: Mapping[str, Any]) -> Drift:
        def part(d: Mapping[str, Any]) -> PartDrift:
            return PartDrift(float(d["change"]), float(d["threshold"]), str(d["verdict"]))

        return cls(part(doc["compute"]), part(doc["bandwidth"]), str(doc["verdict"]))

    def line(self) -> str:
        """steady (compute +1.2%, copy -3.0%; beyond 5.0% and 7.5% it would have moved), or
        unsteady (...) when a part's repeats spread too wide to judge."""
        c, b = self.compute, self.bandwidth
        said = f"{self.verdict} (compute {c.change:+.1%}, copy {b.change:+.1%}; "
        if self.verdict == "unsteady":
            which = " and ".join(
                n for n, p in (("compute", c), ("copy", b)) if p.verdict == "unsteady"
            )
            return said + f"{which} varied by more than {UNSTEADY_SPREAD:.0%} within a timing)"
        return said + f"beyond {c.threshold:.1%} and {b.threshold:.1%} it moved)"


def _part(before: Timing, after: Timing, slower_when_higher: bool, floor: float) -> PartDrift:
    ratio = after.median / before.median if before.median else 1.0
    change = ratio - 1.0 if slower_when_higher else 1.0 / ratio - 1.0
    threshold = max(NOISE_FACTOR * (before.relative_spread + after.relative_spread) / 2, floor)
    if abs(change) > threshold:
        return PartDrift(change, threshold, "moved")
    unsteady = max(before.relative_spread, after.relative_spread) > UNSTEADY_SPREAD
    return PartDrift(change, threshold, "unsteady" if unsteady else "steady")


def drift(before: CpuCanary, after: CpuCanary, floor: float = DRIFT_FLOOR) -> Drift:
    """A part moved when its change exceeds the larger of 3x the mean relative spread of the
    two timings and ``floor``; short of that, it is unsteady when either timing's own spread
    exceeds UNSTEADY_SPREAD (too noisy to call it steady). The canary moved when a part moved,
    else is unsteady when a part is."""
    compute = _part(before.compute, after.compute, True, floor)
    bandwidth = _part(before.bandwidth, after.bandwidth, False, floor)
    verdicts = (compute.verdict, bandwidth.verdict)
    verdict = next((v for v in ("moved", "unsteady") if v in verdicts), "steady")
    return Drift(compute, bandwidth, verdict)


def measure_gpu(repeats: int = REPEATS, size: int = 4096) -> GpuCanary:
    """A fixed fp16 matmul (TFLOP/s) and a device-to-device copy (GB/s) via PyTorch with CUDA."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError as error:
        return GpuCanary(False, f"PyTorch is not importable: {error}")
    if not torch.cuda.is_available():
        return GpuCanary(False, "PyTorch sees no CUDA device")
    a = torch.ones((size, size), dtype=torch.float16, device="cuda")
    flops: list[float] = []
    rates: list[float] = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.matmul(a, a)
        torch.cuda.synchronize()
        flops.append(2 * size**3 / (time.perf_counter() - start) / 1e12)
        start = time.perf_counter()
        a.clone()
        torch.cuda.synchronize()
        rates.append(2 * a.numel() * a.element_size() / (time.perf_counter() - start) / 1e9)
    return GpuCanary(True, "", _summary(flops, "TFLOP/s"), _summary(rates, "GB/s"))


@dataclass(frozen=True)
class RunCanary:
    """run.json `canary`: the CPU canary timed before a sweep job's first server launch and
    after its last, and whether the host's speed moved between them beyond its own noise."""

    before: CpuCanary
    after: CpuCanary
    drift: Drift

    def to_json(self) -> RunCanaryJson:
        return {
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "drift": self.drift.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunCanary:
        return cls(
            CpuCanary.from_json(doc["before"]),
            CpuCanary.from_json(doc["after"]),
            Drift.from_json(doc["drift"]),
        )


@dataclass
class CanaryTimes:
    """The canary as a sweep job takes it: before its first launch, after each launch (the
    last one counts); `measure` is measure_cpu, or a stand-in in a test."""

    measure: Callable[[], CpuCanary] = measure_cpu
    first: CpuCanary | None = None
    last: CpuCanary | None = None

    def before_launch(self) -> CpuCanary | None:
        """Time it before the job's first launch; None (not timed again) before a later one."""
        if self.first is not None:
            return None
        self.first = self.measure()
        return self.first

    def after_launch(self) -> CpuCanary:
        self.last = self.measure()
        return self.last

    def record(self) -> RunCanary | None:
        """The job's canary; None when it launched nothing (every point already complete)."""
        if self.first is None or self.last is None:
            return None
        return RunCanary(self.first, self.last, drift(self.first, self.last))


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
            out[rj.parent.name] = RunCanary.from_json(doc)
    return out
