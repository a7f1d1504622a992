"""The host's speed between two runs, and whether a change of a metric is more than it.

A run records its host-speed canary (hostfacts.canary) in each configuration's run.json, under
`canary` (`before` and `after` its sweep, and their `drift`). Between two runs:

- `host_speed(docs)`: a run's host speed, pooled over every canary its run.json files hold
  (None when none holds one: "host speed not recorded");
- `host_ratio(before, after)`: the after run's host speed over the before run's (above 1: the
  after host is faster), from the compute seconds and the copy bandwidth, with its band: the
  range both parts' own noise (each canary's min and max) allows. Where both runs timed the
  GPU canary (a GPU runtime's `canary.gpu`) of the same work, from its matmul seconds and
  device-copy bandwidth instead (`parts` "gpu"): a GPU server's speed is its GPU's;
- `attribute(...)`: one point's change of a metric (after / before, with its confidence
  interval and whether the test called it real) against that ratio: changed beyond what the
  host explains, changed as much as the host's speed did (not attributed to the code), or
  unchanged; without a canary on both sides a change is a change with "host speed not
  recorded", never a verdict on the code.

The rule (docs/analysis.md, "Changes between runs and the host's speed"): a metric's change
is put in speed terms (throughput after / before; a latency before / after, since a host x
times faster divides a latency by about x), s with its interval [s_low, s_high]. The host
explains it when that interval meets the host's band [h_low, h_high], or s lies within the
band widened by the practical threshold (threshold_pct on either side); otherwise the change
is beyond what the host explains, and its direction is that of s / h.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servelab.analysis.stats import Ratio
from servelab.errors import ServelabError
from servelab.store.paths import ExperimentPaths
from servelab.store.records import RunRecord

BEYOND_HOST = "changed beyond what the host explains"
AS_HOST = "changed as much as the host's speed did (not attributed to the code)"
UNCHANGED = "unchanged"
HOST_NOT_RECORDED = "host speed not recorded"
ANSWERS = (BEYOND_HOST, AS_HOST, UNCHANGED, HOST_NOT_RECORDED)
# the metrics that scale with the host's speed (a host x times faster: about x times more);
# every other point metric is a latency, which scales inversely
SCALES_WITH_SPEED = frozenset({"output_throughput", "request_throughput", "total_token_throughput"})


@dataclass(frozen=True)
class Span:
    """A canary part pooled over a run: the median of its medians, the lowest low and the
    highest high."""

    median: float
    low: float
    high: float


@dataclass(frozen=True)
class GpuSpeed:
    """A run's GPU speed: the GPU canary's matmul seconds (lower is faster) and device-copy
    GB/s (higher is faster), over `canaries` timings of the work `work` (its id)."""

    matmul_s: Span
    copy_gbs: Span
    canaries: int
    work: str


@dataclass(frozen=True)
class HostSpeed:
    """A run's host speed: the compute seconds of the fixed work (lower is faster) and the copy
    bandwidth in GB/s (higher is faster), over `canaries` measurements of `work` (checksum,
    iterations, buffer MiB: two runs compare only on the same work); `gpu` where its run.json
    files hold GPU canaries (a GPU runtime)."""

    compute_s: Span
    bandwidth_gbs: Span
    canaries: int
    work: tuple[int, int, int]
    gpu: GpuSpeed | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.gpu is None:  # a CPU runtime's: as before the GPU canary was recorded
            del out["gpu"]
        return out


@dataclass(frozen=True)
class HostRatio:
    """The after run's host speed over the before run's (above 1: faster): `compute` and
    `bandwidth` each as a speed ratio, `ratio` their geometric mean, and `low`, `high` the
    band both parts' noise allows (the hull of the two parts' ranges)."""

    ratio: float
    low: float
    high: float
    compute: float
    bandwidth: float
    # "gpu": `compute` and `bandwidth` are the GPU canary's matmul and device copy; "cpu": the
    # CPU canary's compute and copy
    parts: str = "cpu"

    @property
    def moved(self) -> bool:
        """Whether the host's speed changed beyond its own noise (the band excludes 1)."""
        return not self.low <= 1.0 <= self.high

    def to_json(self) -> dict[str, Any]:
        out = asdict(self) | {"moved": self.moved}
        if self.parts == "cpu":  # as before the GPU canary was recorded
            del out["parts"]
        return out


def _number(part: Mapping[str, Any], key: str, where: str) -> float:
    value = part.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ServelabError(
            f"{where}.{key}: {value!r} is not a positive number; measure the run again or "
            "remove its canary"
        )
    return float(value)


def _canaries(label: str, doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    canary = doc.get("canary")
    if canary is None:
        return []
    if not isinstance(canary, Mapping):
        raise ServelabError(f"{label}: canary is not an object; measure the run again")
    out = []
    for when in ("before", "after"):
        c = canary.get(when)
        if not isinstance(c, Mapping):
            raise ServelabError(f"{label}: canary.{when} is missing; measure the run again")
        out.append((f"{label}: canary.{when}", c))
    return out


def _span(parts: list[tuple[str, Mapping[str, Any]]], name: str) -> Span:
    found: list[tuple[float, ...]] = []
    for where, c in parts:
        part = c.get(name)
        if not isinstance(part, Mapping):
            raise ServelabError(f"{where}.{name} is missing; measure the run again")
        w = f"{where}.{name}"
        found.append(tuple(_number(part, k, w) for k in ("median", "low", "high")))
    return Span(
        statistics.median(m for m, _, _ in found),
        min(lo for _, lo, _ in found),
        max(hi for _, _, hi in found),
    )


def host_speed(docs: Mapping[str, Mapping[str, Any]]) -> HostSpeed | None:
    """A run's host speed from its run.json documents (by a label naming each file in an
    error), pooled over every `canary.before` and `canary.after` they hold; None when none
    holds a canary. A damaged canary, or canaries of different work, raise one line."""
    parts = [p for label, doc in sorted(docs.items()) for p in _canaries(label, doc)]
    if not parts:
        return None
    works = {(c.get("checksum"), c.get("iterations"), c.get("buffer_mib")) for _, c in parts}
    if len(works) != 1:
        raise ServelabError(
            f"{parts[0][0].split(':')[0]}: the canaries of one run time different work "
            "(checksum, iterations, buffer_mib); measure the run again"
        )
    checksum, iterations, buffer_mib = works.pop()
    work = (int(checksum or 0), int(iterations or 0), int(buffer_mib or 0))
    gpu = _gpu_speed(sorted(docs.items()))
    return HostSpeed(_span(parts, "compute"), _span(parts, "bandwidth"), len(parts), work, gpu)


def _gpu_speed(docs: list[tuple[str, Mapping[str, Any]]]) -> GpuSpeed | None:
    """The GPU canaries of a run's run.json documents, pooled; None when none timed one."""
    parts: list[tuple[str, Mapping[str, Any]]] = []
    for label, doc in docs:
        canary = doc.get("canary")
        gpu = canary.get("gpu") if isinstance(canary, Mapping) else None
        if not isinstance(gpu, Mapping) or not gpu.get("present"):
            continue
        for when in ("before", "after"):
            c = gpu.get(when)
            if not isinstance(c, Mapping):
                raise ServelabError(f"{label}: canary.gpu.{when} is missing; measure the run again")
            parts.append((f"{label}: canary.gpu.{when}", c))
    if not parts:
        return None
    works = {str((c.get("work") or {}).get("id")) for _, c in parts}
    if len(works) != 1:
        raise ServelabError(
            f"{parts[0][0].split(':')[0]}: the GPU canaries of one run time different work; "
            "measure the run again"
        )
    return GpuSpeed(_span(parts, "matmul"), _span(parts, "copy"), len(parts), works.pop())


def read_host_speed(root: Path) -> HostSpeed | None:
    """The host speed of the run (an experiment folder or a bundle) at `root`, from every
    raw/<sc>/run.json; None when none records a canary."""
    docs = {str(rj): dict(RunRecord.read(rj).doc) for rj in ExperimentPaths(root).run_files()}
    return host_speed(docs)


def why_no_ratio(
    before: HostSpeed | None,
    after: HostSpeed | None,
    names: tuple[str, str] = ("the earlier run", "the later run"),
) -> str | None:
    """Why two runs' host speeds (the runs called `names`) cannot be compared, in words; None
    when they can."""
    missing = [w for w, h in zip(names, (before, after), strict=True) if h is None]
    if len(missing) == 2:
        return f"{HOST_NOT_RECORDED}: neither {names[0]} nor {names[1]} measured the canary"
    if missing:
        return f"{HOST_NOT_RECORDED}: {missing[0]} did not measure the canary"
    assert before is not None and after is not None
    if before.work != after.work:
        return (
            f"{HOST_NOT_RECORDED} comparably: the canaries of {names[0]} and {names[1]} "
            "time different work"
        )
    return None


def host_ratio(before: HostSpeed | None, after: HostSpeed | None) -> HostRatio | None:
    """The after run's host speed over the before run's, with its band; None where
    `why_no_ratio` gives a reason."""
    if before is None or after is None or why_no_ratio(before, after) is not None:
        return None
    bg, ag = before.gpu, after.gpu
    if bg is not None and ag is not None and bg.work == ag.work:
        # a GPU runtime's: the server's speed is its GPU's
        return _ratio(bg.matmul_s, ag.matmul_s, bg.copy_gbs, ag.copy_gbs, "gpu")
    return _ratio(
        before.compute_s, after.compute_s, before.bandwidth_gbs, after.bandwidth_gbs, "cpu"
    )


def _ratio(bc: Span, ac: Span, bb: Span, ab: Span, parts: str) -> HostRatio:
    """From seconds before and after (bc, ac) and a bandwidth before and after (bb, ab)."""
    compute = bc.median / ac.median  # seconds: the faster host takes fewer
    bandwidth = ab.median / bb.median
    low = min(bc.low / ac.high, ab.low / bb.high)
    high = max(bc.high / ac.low, ab.high / bb.low)
    ratio = math.sqrt(compute * bandwidth)
    return HostRatio(ratio, min(low, ratio), max(high, ratio), compute, bandwidth, parts)


@dataclass(frozen=True)
class Attribution:
    """One point's change against the host: `answer` (one of ANSWERS); `speed` the change in
    speed terms (s: above 1, faster); `vs_host` s over the host's ratio (None without one);
    `direction` "better" or "worse" for a change beyond the host, else None."""

    answer: str
    speed: float | None
    vs_host: float | None
    direction: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _in_speed_terms(ratio: Ratio, metric: str) -> tuple[float, float, float]:
    """after / before of `metric` as (s, s_low, s_high): a speed ratio, above 1 when faster."""
    lo = ratio.low if ratio.low is not None else ratio.value
    hi = ratio.high if ratio.high is not None else ratio.value
    if metric in SCALES_WITH_SPEED:
        return ratio.value, lo, hi
    return 1.0 / ratio.value, 1.0 / hi, 1.0 / lo


def attribute(
    metric: str,
    ratio: Ratio | None,
    changed: bool,
    host: HostRatio | None,
    threshold_pct: float,
) -> Attribution:
    """Attribute one point's change of `metric` (`ratio`: after / before with its interval;
    `changed`: the test, under the false discovery control and the practical threshold,
    called it real) given the host's speed ratio `host` (None: not recorded on both sides)."""
    if not changed or ratio is None or ratio.value <= 0:
        return Attribution(UNCHANGED, None, None, None)
    s, s_low, s_high = _in_speed_terms(ratio, metric)
    if host is None:
        return Attribution(HOST_NOT_RECORDED, s, None, None)
    widen = 1.0 + threshold_pct / 100.0
    meets = s_low <= host.high and s_high >= host.low
    within = host.low / widen <= s <= host.high * widen
    vs_host = s / host.ratio
    if meets or within:
        return Attribution(AS_HOST, s, vs_host, None)
    return Attribution(BEYOND_HOST, s, vs_host, "better" if vs_host > 1.0 else "worse")
