"""The host's speed between two runs, and whether a change of a metric is more than it.

A run records its host-speed canary (hostfacts.canary) in each configuration's run.json, under
`canary` (`before` and `after` its sweep, and their `drift`). Between two runs:

- `host_speed(docs)`: a run's host speed, pooled over every canary its run.json files hold
  (None when none holds one: "host speed not recorded"), with every timing's repeats and every
  configuration's drift verdict;
- `host_ratio(before, after)`: the after run's host speed over the before run's (above 1: the
  after host is faster), from the compute seconds and the copy bandwidth, with its 95% interval
  from a bootstrap over both runs' timings (analysis.canaryboot). Where both runs timed the GPU
  canary (a GPU runtime's `canary.gpu`) of the same work, from its matmul seconds and
  device-copy bandwidth instead (`parts` "gpu"): a GPU server's speed is its GPU's; the CPU
  canary's ratio is then kept beside it (`cpu`), since the server's CPU side runs on the host.
  Only where both ran with the same PyTorch and CUDA builds (`GpuSpeed.builds`): another build's
  cuBLAS is no host speed, so two builds give no ratio, "host speed not comparable: torch
  2.5.1+cu124 -> 2.6.0+cu126", and canaries recorded without their build "host speed not
  comparable (build not recorded in ...)" (`why_no_ratio`);
- `attribute(...)`: one point's change of a metric (after / before, with its confidence
  interval and whether the test called it real) against that ratio, by the gate below.

The gate (docs/analysis.md, "Changes between runs and the host's speed"). A change is put in
speed terms: s = after / before for a throughput, before / after for a latency (a host x times
faster divides a latency by about x), with its interval [s_low, s_high]. That interval is
widened for the run-to-run spread one pair of runs cannot measure (`Gate.run_spread_pct`, r:
each half-width on logs becomes sqrt(half^2 + (1.96 sqrt(2) ln(1 + r))^2)). The host-adjusted
change is s / h with the interval [s_low / h_high, s_high / h_low] (on logs, interval
arithmetic: every ratio both intervals allow). With the equivalence margin m
(analysis.equivalence):

- unchanged: the test did not call a change;
- host speed not recorded: a change, but a run has no canary (or canaries of other work, or
  GPU canaries of other PyTorch or CUDA builds);
- unknown (the canary cannot tell): either run's canary drift is `unsteady` or `moved`; or
  the host ratio's interval is wider than twice the margin (high / low > (1 + m)^2); or, on a
  GPU runtime, the CPU canary's ratio interval is not inside the margin (the host's CPU side
  changed); or the host-adjusted interval straddles the margin's edge; or it lies wholly
  outside on the other side of 1 from s itself (the host ratio alone would turn a change for
  the worse into one for the better, or back: a canary that misread the host flips a sign).
  Its text names the rerun that settles it: `servelab rerun REFERENCE_BUNDLE CURRENT_BUNDLE`;
- changed as much as the host's speed did: the host-adjusted interval lies inside
  [1 / (1 + m), 1 + m];
- changed beyond what the host explains: it lies wholly outside, on the same side of 1 as s,
  `direction` better (above) or worse (below).

The canary is a gate and a note, never a rescaler: no metric is divided by it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servelab.analysis.canaryboot import Record, as_ratios, log_ratio, repeats_of
from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT, DIFFERENT, FASTER, SAME, word_for
from servelab.analysis.stats import Ratio
from servelab.errors import ServelabError
from servelab.hostfacts.gpucanary import build_text
from servelab.store.paths import ExperimentPaths
from servelab.store.records import RunRecord

BEYOND_HOST = "changed beyond what the host explains"
AS_HOST = "changed as much as the host's speed did (not attributed to the code)"
UNKNOWN = "unknown: the canary cannot tell the host's speed from the code's"
UNCHANGED = "unchanged"
HOST_NOT_RECORDED = "host speed not recorded"
# two runs' GPU canaries ran with other PyTorch or CUDA builds, or did not record theirs
HOST_NOT_COMPARABLE = "host speed not comparable"
ANSWERS = (BEYOND_HOST, AS_HOST, UNKNOWN, UNCHANGED, HOST_NOT_RECORDED)


def no_speed_words(why_not: object) -> str:
    """Why two runs have no host-speed ratio, in the words a report shows: "not recorded",
    "not recorded (neither ... measured the canary)", or, for canaries of other builds, "host
    speed not comparable: torch A -> B" as it is."""
    why = str(why_not or HOST_NOT_RECORDED)
    if why.startswith(HOST_NOT_COMPARABLE):
        return why
    rest = why.removeprefix(HOST_NOT_RECORDED).strip(": ")
    return "not recorded" + (f" ({rest})" if rest else "")


# the metrics that scale with the host's speed (a host x times faster: about x times more);
# every other point metric is a latency, which scales inversely
SCALES_WITH_SPEED = frozenset({"output_throughput", "request_throughput", "total_token_throughput"})
# the spread of a run's level beyond its own repeats, which one pair of runs cannot measure: two
# quiet runs of the same code on one 2-vCPU host class differ by 24-40%, so a run's level strays
# by at least 10% (log-normal sd) from run to run. The cross-run rule allows for that much; with
# it, identical code is called "beyond the host" in under 2% of simulated pairs at up to 10% of
# release-to-release noise (benchmarks/README.md, "Cross-run attribution, simulated")
RUN_SPREAD_PCT = 10.0
Z95 = 1.959963984540054
RERUN = "servelab rerun {reference} {current}"
DRIFTS = ("moved", "unsteady", "steady")  # worst first


def rerun_command(reference: str = "REFERENCE_BUNDLE", current: str = "CURRENT_BUNDLE") -> str:
    """The command that compares two runs on one host, interleaved (analysis.equivalence)."""
    return RERUN.format(reference=reference, current=current)


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
    GB/s (higher is faster), over `canaries` timings of the work `work` (its id); `records`
    each timing's repeats, `drift` each configuration's GPU drift verdict, `builds` the PyTorch
    and CUDA builds the timings ran with (gpucanary.build_text; None: one not recorded)."""

    matmul_s: Span
    copy_gbs: Span
    canaries: int
    work: str
    records: tuple[Record, ...] = ()
    drift: tuple[str, ...] = ()
    builds: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class HostSpeed:
    """A run's host speed: the compute seconds of the fixed work (lower is faster) and the copy
    bandwidth in GB/s (higher is faster), over `canaries` measurements of `work` (checksum,
    iterations, buffer MiB: two runs compare only on the same work); `gpu` where its run.json
    files hold GPU canaries (a GPU runtime); `records` each timing's repeats (empty: the Spans'
    low, median and high stand for one timing) and `drift` each configuration's verdict."""

    compute_s: Span
    bandwidth_gbs: Span
    canaries: int
    work: tuple[int, int, int]
    gpu: GpuSpeed | None = None
    records: tuple[Record, ...] = ()
    drift: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("records", "drift")}
        if self.gpu is None:  # a CPU runtime's: as before the GPU canary was recorded
            del out["gpu"]
        else:
            kept = ("records", "drift", "builds")
            out["gpu"] = {k: v for k, v in out["gpu"].items() if k not in kept}
        return out


@dataclass(frozen=True)
class HostRatio:
    """The after run's host speed over the before run's (above 1: faster): `compute` and
    `bandwidth` each as a speed ratio, `ratio` their geometric mean, and `low`, `high` its 95%
    bootstrap interval (analysis.canaryboot). `drift` the worst canary drift of either run
    (`moved`, `unsteady`, `steady`; "" where none is recorded) and `drift_in` the runs it was
    in ("before", "after"); `cpu` the CPU canary's (ratio, low, high) where `parts` is "gpu"."""

    ratio: float
    low: float
    high: float
    compute: float
    bandwidth: float
    # "gpu": `compute` and `bandwidth` are the GPU canary's matmul and device copy; "cpu": the
    # CPU canary's compute and copy
    parts: str = "cpu"
    drift: str = ""
    drift_in: tuple[str, ...] = ()
    cpu: tuple[float, float, float] | None = None

    @property
    def moved(self) -> bool:
        """Whether the host's speed changed beyond its own noise (the interval excludes 1)."""
        return not self.low <= 1.0 <= self.high

    def to_json(self) -> dict[str, Any]:
        out = asdict(self) | {"moved": self.moved}
        out["drift_in"] = list(self.drift_in)
        for key, empty in (("parts", "cpu"), ("drift", ""), ("drift_in", []), ("cpu", None)):
            if out[key] == empty:  # as before they were recorded
                del out[key]
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


def _part(where: str, c: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    part = c.get(name)
    if not isinstance(part, Mapping):
        raise ServelabError(f"{where}.{name} is missing; measure the run again")
    return part


def _span(parts: list[tuple[str, Mapping[str, Any]]], name: str) -> Span:
    found: list[tuple[float, ...]] = []
    for where, c in parts:
        part, w = _part(where, c, name), f"{where}.{name}"
        found.append(tuple(_number(part, k, w) for k in ("median", "low", "high")))
    return Span(
        statistics.median(m for m, _, _ in found),
        min(lo for _, lo, _ in found),
        max(hi for _, _, hi in found),
    )


def _repeats(where: str, c: Mapping[str, Any], name: str) -> tuple[float, ...]:
    """A part's repeats: its `timings`, else what (low, median, high) stand for
    (analysis.canaryboot)."""
    part, w = _part(where, c, name), f"{where}.{name}"
    kept = part.get("timings")
    if kept is not None:
        if not isinstance(kept, list) or not kept:
            raise ServelabError(f"{w}.timings: {kept!r} is not a list of timings; measure again")
        return tuple(_number({"timings": x}, "timings", w) for x in kept)
    med, low, high = (_number(part, k, w) for k in ("median", "low", "high"))
    n = part.get("repeats")
    return repeats_of(med, low, high, n if isinstance(n, int) and not isinstance(n, bool) else 3)


def _records(
    parts: list[tuple[str, Mapping[str, Any]]], names: tuple[str, str]
) -> tuple[Record, ...]:
    return tuple(Record(_repeats(w, c, names[0]), _repeats(w, c, names[1])) for w, c in parts)


def _drift(canary: Any) -> list[str]:
    """A canary's drift verdict, [] where it records none (a canary made by hand)."""
    drift = canary.get("drift") if isinstance(canary, Mapping) else None
    verdict = drift.get("verdict") if isinstance(drift, Mapping) else None
    return [verdict] if verdict in DRIFTS else []


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
    drift = tuple(v for _, doc in sorted(docs.items()) for v in _drift(doc.get("canary")))
    return HostSpeed(
        _span(parts, "compute"),
        _span(parts, "bandwidth"),
        len(parts),
        work,
        gpu,
        _records(parts, ("compute", "bandwidth")),
        drift,
    )


def _gpu_speed(docs: list[tuple[str, Mapping[str, Any]]]) -> GpuSpeed | None:
    """The GPU canaries of a run's run.json documents, pooled; None when none timed one."""
    parts: list[tuple[str, Mapping[str, Any]]] = []
    drift: list[str] = []
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
        drift += _drift(gpu)
    if not parts:
        return None
    works = {str((c.get("work") or {}).get("id")) for _, c in parts}
    if len(works) != 1:
        raise ServelabError(
            f"{parts[0][0].split(':')[0]}: the GPU canaries of one run time different work; "
            "measure the run again"
        )
    records = _records(parts, ("matmul", "copy"))
    matmul, copy = _span(parts, "matmul"), _span(parts, "copy")
    builds = {_build(c) for _, c in parts}
    ordered = tuple(sorted(builds, key=lambda b: (b is None, b or "")))
    return GpuSpeed(matmul, copy, len(parts), works.pop(), records, tuple(drift), ordered)


def _build(c: Mapping[str, Any]) -> str | None:
    """A GPU canary's PyTorch and CUDA builds in words, None where it did not record them."""
    version, cuda = c.get("torch_version"), c.get("cuda")
    return build_text(
        version if isinstance(version, str) else None, cuda if isinstance(cuda, str) else None
    )


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
    bg, ag = before.gpu, after.gpu
    if bg is not None and ag is not None and bg.work == ag.work:
        return why_other_builds(bg, ag, names)
    return None


def why_other_builds(before: GpuSpeed, after: GpuSpeed, names: tuple[str, str]) -> str | None:
    """Why two runs' GPU canaries of the same work do not compare (None: they do): they ran
    with other PyTorch or CUDA builds (another cuBLAS is no host speed), or a run's did not
    record its build."""
    unrecorded = [n for n, g in zip(names, (before, after), strict=True) if None in g.builds]
    if unrecorded or not before.builds or not after.builds:
        where = " and ".join(unrecorded or names)
        return f"{HOST_NOT_COMPARABLE} (build not recorded in {where})"
    if before.builds != after.builds:
        return (
            f"{HOST_NOT_COMPARABLE}: torch {', '.join(str(b) for b in before.builds)} -> "
            f"{', '.join(str(b) for b in after.builds)}"
        )
    return None


def _cpu_records(h: HostSpeed) -> tuple[Record, ...]:
    if h.records:
        return h.records
    c, b = h.compute_s, h.bandwidth_gbs  # a host speed given by its spans alone
    return (Record((c.low, c.median, c.high), (b.low, b.median, b.high)),)


def _gpu_records(g: GpuSpeed) -> tuple[Record, ...]:
    if g.records:
        return g.records
    m, c = g.matmul_s, g.copy_gbs
    return (Record((m.low, m.median, m.high), (c.low, c.median, c.high)),)


def _worst(before: tuple[str, ...], after: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The worst drift verdict of two runs and the runs it was in ("" with none recorded)."""
    for verdict in DRIFTS:
        where = tuple(w for w, d in (("before", before), ("after", after)) if verdict in d)
        if where:
            return verdict, where
    return "", ()


def host_ratio(before: HostSpeed | None, after: HostSpeed | None) -> HostRatio | None:
    """The after run's host speed over the before run's, with its interval; None where
    `why_no_ratio` gives a reason."""
    if before is None or after is None or why_no_ratio(before, after) is not None:
        return None
    cpu = log_ratio(_cpu_records(before), _cpu_records(after))
    bg, ag = before.gpu, after.gpu
    if bg is not None and ag is not None and bg.work == ag.work:
        # a GPU runtime's: the server's speed is its GPU's; its CPU side's kept beside it
        gpu = log_ratio(_gpu_records(bg), _gpu_records(ag))
        drift, where = _worst(before.drift + bg.drift, after.drift + ag.drift)
        ratio, low, high = as_ratios(gpu)
        both = (math.exp(gpu.compute), math.exp(gpu.bandwidth))
        return HostRatio(ratio, low, high, *both, "gpu", drift, where, as_ratios(cpu))
    drift, where = _worst(before.drift, after.drift)
    ratio, low, high = as_ratios(cpu)
    both = (math.exp(cpu.compute), math.exp(cpu.bandwidth))
    return HostRatio(ratio, low, high, *both, "cpu", drift, where)


@dataclass(frozen=True)
class Gate:
    """How a change is set against the host's speed: the equivalence margin (%), the run-to-run
    spread allowed for (%), the rerun an UNKNOWN names, and the two runs' names in its reason."""

    margin_pct: float = DEFAULT_MARGIN_PCT
    run_spread_pct: float = RUN_SPREAD_PCT
    rerun: str = rerun_command()
    names: tuple[str, str] = ("the earlier run", "the later run")


@dataclass(frozen=True)
class Attribution:
    """One point's change against the host: `answer` (one of ANSWERS); `speed` the change in
    speed terms (s: above 1, faster); `vs_host` s over the host's ratio (None without one);
    `direction` "better" or "worse" for a change beyond the host, else None; `adjusted` the
    host-adjusted interval (s / h) the gate read; `why` for UNKNOWN, the reason and the rerun
    command."""

    answer: str
    speed: float | None
    vs_host: float | None
    direction: str | None
    adjusted: tuple[float, float] | None = None
    why: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _in_speed_terms(ratio: Ratio, metric: str) -> tuple[float, float, float]:
    """after / before of `metric` as (s, s_low, s_high): a speed ratio, above 1 when faster."""
    lo = ratio.low if ratio.low is not None else ratio.value
    hi = ratio.high if ratio.high is not None else ratio.value
    if metric in SCALES_WITH_SPEED:
        return ratio.value, lo, hi
    return 1.0 / ratio.value, 1.0 / hi, 1.0 / lo


def widened(s: float, low: float, high: float, spread_pct: float) -> tuple[float, float]:
    """[low, high] around s, each half-width on logs combined in quadrature with the 95% band
    of two runs' difference at a run-to-run spread of `spread_pct`."""
    allow = Z95 * math.sqrt(2.0) * math.log1p(spread_pct / 100.0)
    below, above = math.log(s / low), math.log(high / s)
    return s * math.exp(-math.hypot(below, allow)), s * math.exp(math.hypot(above, allow))


def gate_reason(host: HostRatio, gate: Gate) -> str | None:
    """Why the canary cannot tell, before any change is read (None: it may): a drift that
    moved or was unsteady, a host ratio too unsure, a GPU host whose CPU side changed."""
    m = gate.margin_pct
    if host.drift in ("moved", "unsteady"):
        runs = " and ".join(gate.names[0 if w == "before" else 1] for w in host.drift_in)
        return f"the canary's drift was {host.drift} in {runs}"
    if host.high / host.low > (1.0 + m / 100.0) ** 2:
        return (
            f"the host ratio's interval, {host.low:.3g} to {host.high:.3g}, is wider than twice "
            f"the {m:g}% margin"
        )
    if host.cpu is not None and word_for(host.cpu[1], host.cpu[2], m)[0] != SAME:
        return (
            f"the host's CPU side changed: the CPU canary's ratio, {host.cpu[1]:.3g} to "
            f"{host.cpu[2]:.3g}, is not inside the {m:g}% margin"
        )
    return None


def _read(s: float, adjusted: tuple[float, float], host: HostRatio, gate: Gate) -> Attribution:
    """The host-adjusted interval against the margin, once the gate lets the canary be read:
    inside, as the host; wholly outside and the same way as the change itself, beyond it;
    otherwise UNKNOWN (the canary may confirm or withhold a change, never turn its way)."""
    vs_host = s / host.ratio
    word, direction = word_for(*adjusted, gate.margin_pct)
    if word == SAME:
        return Attribution(AS_HOST, s, vs_host, None, adjusted)
    if word == DIFFERENT and (direction == FASTER) == (s > 1.0):
        better = "better" if direction == FASTER else "worse"
        return Attribution(BEYOND_HOST, s, vs_host, better, adjusted)
    if word == DIFFERENT:
        why = (
            f"the host ratio alone, {host.ratio:.3g}, would turn a change {_way(s)} into one "
            f"{_way(vs_host)}"
        )
    else:
        why = (
            f"the host-adjusted change, {adjusted[0]:.3g} to {adjusted[1]:.3g}, is neither "
            f"inside nor outside the {gate.margin_pct:g}% margin"
        )
    return _unknown(s, adjusted, host, gate, why)


def _way(speed: float) -> str:
    return "for the better" if speed > 1.0 else "for the worse"


def _unknown(
    s: float, adjusted: tuple[float, float], host: HostRatio, gate: Gate, why: str
) -> Attribution:
    why += f"; compare both on one host: `{gate.rerun}`"
    return Attribution(UNKNOWN, s, s / host.ratio, None, adjusted, why)


def judge(s: float, interval: tuple[float, float], host: HostRatio, gate: Gate) -> Attribution:
    """A change s (speed terms) with its (already widened) interval against the host ratio,
    by the gate (module docstring)."""
    adjusted = (interval[0] / host.high, interval[1] / host.low)
    why = gate_reason(host, gate)
    if why is not None:
        return _unknown(s, adjusted, host, gate, why)
    return _read(s, adjusted, host, gate)


def attribute(
    metric: str,
    ratio: Ratio | None,
    changed: bool,
    host: HostRatio | None,
    gate: Gate | None = None,
) -> Attribution:
    """Attribute one point's change of `metric` (`ratio`: after / before with its interval;
    `changed`: the test, under the false discovery control and the practical threshold,
    called it real) given the host's speed ratio `host` (None: not recorded on both sides),
    by the gate of the module docstring."""
    if not changed or ratio is None or ratio.value <= 0:
        return Attribution(UNCHANGED, None, None, None)
    s, s_low, s_high = _in_speed_terms(ratio, metric)
    if host is None:
        return Attribution(HOST_NOT_RECORDED, s, None, None)
    g = gate or Gate()
    return judge(s, widened(s, s_low, s_high, g.run_spread_pct), host, g)
