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

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

Timer = Callable[[], float]

# ~85 ms a repeat on a 2-vCPU AMD EPYC (Zen 4): the five repeats and the copies take ~0.7 s
COMPUTE_ITERATIONS = 300_000
BUFFER_MIB = 64
REPEATS = 5
DRIFT_FLOOR = 0.05
NOISE_FACTOR = 3.0


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

    def to_json(self) -> CpuCanaryJson:
        return {
            "compute": self.compute.to_json(),
            "bandwidth": self.bandwidth.to_json(),
            "checksum": self.checksum,
            "iterations": self.iterations,
            "buffer_mib": self.buffer_mib,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CpuCanary:
        return cls(
            Timing.from_json(doc["compute"]),
            Timing.from_json(doc["bandwidth"]),
            int(doc["checksum"]),
            int(doc["iterations"]),
            int(doc["buffer_mib"]),
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


def _time_compute(iterations: int, repeats: int, timer: Timer) -> tuple[Timing, int]:
    seconds: list[float] = []
    checksum = 0
    for _ in range(repeats):
        start = timer()
        checksum = compute_work(iterations)
        seconds.append(timer() - start)
    return _summary(seconds, "s"), checksum


def _time_bandwidth(buffer_mib: int, repeats: int, timer: Timer) -> Timing:
    size = buffer_mib * 1024 * 1024
    source = memoryview(bytearray(size))
    target = memoryview(bytearray(size))
    rates: list[float] = []
    for _ in range(repeats):
        start = timer()
        target[:] = source
        elapsed = max(timer() - start, 1e-9)
        rates.append(size / elapsed / 1e9)
    return _summary(rates, "GB/s")


def measure_cpu(
    iterations: int = COMPUTE_ITERATIONS,
    buffer_mib: int = BUFFER_MIB,
    repeats: int = REPEATS,
    timer: Timer = time.perf_counter,
) -> CpuCanary:
    """Time the fixed compute work and the buffer copies, ``repeats`` times each."""
    compute, checksum = _time_compute(iterations, repeats, timer)
    bandwidth = _time_bandwidth(buffer_mib, repeats, timer)
    return CpuCanary(compute, bandwidth, checksum, iterations, buffer_mib)


@dataclass(frozen=True)
class PartDrift:
    """One part's relative change (positive: the host got slower) and its verdict."""

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
        """steady (compute +1.2%, copy -3.0%; beyond 5.0% and 7.5% it would have moved)"""
        c, b = self.compute, self.bandwidth
        return (
            f"{self.verdict} (compute {c.change:+.1%}, copy {b.change:+.1%}; "
            f"beyond {c.threshold:.1%} and {b.threshold:.1%} it moved)"
        )


def _part(before: Timing, after: Timing, slower_when_higher: bool, floor: float) -> PartDrift:
    ratio = after.median / before.median if before.median else 1.0
    change = ratio - 1.0 if slower_when_higher else 1.0 / ratio - 1.0
    threshold = max(NOISE_FACTOR * (before.relative_spread + after.relative_spread) / 2, floor)
    return PartDrift(change, threshold, "moved" if abs(change) > threshold else "steady")


def drift(before: CpuCanary, after: CpuCanary, floor: float = DRIFT_FLOOR) -> Drift:
    """The threshold: the larger of 3x the mean relative spread of the two and ``floor``."""
    compute = _part(before.compute, after.compute, True, floor)
    bandwidth = _part(before.bandwidth, after.bandwidth, False, floor)
    moved = "moved" in (compute.verdict, bandwidth.verdict)
    return Drift(compute, bandwidth, "moved" if moved else "steady")


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
