"""The passes over a trace that the analysis is made from: busy time and per-kernel totals per
window, the main attention kernel (a kernel family and its instantiations), the grid dimension
that carries the population, and the forwards per window and device. nsys exports are read by
servelab.profile.nsys, torch traces by servelab.profile.torchtrace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property

from servelab.documents.declared import Instantiation
from servelab.errors import ServelabError
from servelab.profile.forwards import DIMS, ForwardGrouper, Launch, choose_dim
from servelab.profile.gpumatch import TelemetryGpu
from servelab.profile.kernels import (
    Family,
    KernelStat,
    default_families,
    kernel_family,
    main_attention,
)
from servelab.profile.nsys import NsysTrace
from servelab.profile.nsys_main import MainPass, MainQuery
from servelab.profile.stepmatch import projectable, step_groupers
from servelab.profile.steps import StepRange
from servelab.profile.torchtrace import TorchTrace
from servelab.profile.windows import ResolvedWindow


def _default_band() -> float:
    """profile.band at its schema default."""
    from servelab.config import default_section
    from servelab.experiment import ProfileSection

    return default_section(ProfileSection, "profile").band


@dataclass
class TraceOptions:
    """How a trace is analyzed: the layer count, kernel families, the main attention kernel,
    the population dimension and the steady-state band; and the GPUs the telemetry sampled
    (nsys: the trace's GPUs are matched to them by UUID, servelab.profile.gpumatch; None:
    not given)."""

    layers: int | None = None
    layers_source: str | None = None
    families: list[Family] = field(default_factory=default_families)
    attention_kernel: str | None = None
    population_dim: str | None = None  # x | y | z; None: found from the launches
    band: float = field(default_factory=_default_band)
    # grid dimensions that name an attention path (indices); None: those that do not scale
    # with the forward's population, found from the forwards
    path_dims: tuple[int, ...] | None = None
    path_dims_source: str | None = None
    telemetry_gpus: tuple[TelemetryGpu, ...] | None = None


@dataclass(frozen=True)
class Passes:
    """What a reader's passes over a trace give: per window, busy time per device and the
    per-kernel totals; the main attention kernel's names (its family's instantiations, each
    with a label), the grid dimension that carries the population, the forwards per
    (window, device), vLLM's step ranges (nsys), and what the forwards' populations are read
    from (`population`: "grid", "steps" (vLLM's step ranges), "step" (a CPU trace's engine
    steps) or None)."""

    busy: list[dict[str, int]]
    stats: list[list[KernelStat]]
    main: set[str]
    dim: int | None
    groupers: dict[tuple[int, str], ForwardGrouper]
    labels: dict[str, str] = field(default_factory=dict)  # instantiation -> "#1", "#2", ...
    family: str | None = None
    steps: list[StepRange] = field(default_factory=list)
    population: str | None = None

    @cached_property
    def display(self) -> dict[str, str]:
        """Full kernel name -> the name shown (nsys shortName, torch op name)."""
        return {s.full: s.name for per in self.stats for s in per}


def _main_kernel(
    stats: Sequence[Sequence[KernelStat]],
    opts: TraceOptions,
    leaves: set[str] | None,
    family_of: Mapping[str, str] | None = None,
) -> set[str]:
    totals: dict[str, int] = {}
    for per in stats:
        for s in per:
            totals[s.full] = totals.get(s.full, 0) + s.total_ns
    return main_attention(totals, opts.families, opts.attention_kernel, leaves, family_of)


def _families_of(stats: Sequence[Sequence[KernelStat]]) -> dict[str, str]:
    """Full name -> kernel family (kernels.kernel_family), from the name shown (nsys
    shortName) where there is one."""
    return {s.full: kernel_family(s.full, s.name) for per in stats for s in per}


def _labels(stats: Sequence[Sequence[KernelStat]], main: set[str]) -> dict[str, str]:
    """The main attention kernel's instantiations labelled #1, #2, ... by total time over all
    windows (then by name)."""
    totals: dict[str, int] = {}
    for per in stats:
        for s in per:
            if s.full in main:
                totals[s.full] = totals.get(s.full, 0) + s.total_ns
    order = sorted(totals, key=lambda n: (-totals[n], n))
    return {n: f"#{i + 1}" for i, n in enumerate(order)}


def _family_name(main: set[str], family_of: Mapping[str, str]) -> str | None:
    return ", ".join(sorted({family_of.get(n, n) for n in main})) or None


def instantiations(passes: Passes) -> list[Instantiation]:
    acc: dict[str, list[int]] = {}
    for per in passes.stats:
        for s in per:
            if s.full in passes.labels:
                a = acc.setdefault(s.full, [0, 0])
                a[0] += s.calls
                a[1] += s.total_ns
    rows: list[Instantiation] = [
        {
            "label": passes.labels[n],
            "kernel": passes.display.get(n, n),
            "name": n,
            "calls": calls,
            "total_us": total / 1000.0,
        }
        for n, (calls, total) in acc.items()
    ]
    rows.sort(key=lambda r: int(str(r["label"])[1:]))
    return rows


def nsys_passes(
    trace: NsysTrace, resolved: Sequence[ResolvedWindow], opts: TraceOptions, notes: list[str]
) -> Passes:
    """Busy time in a second thread (SQLite runs it outside the GIL) while this one reads the
    per-kernel totals and then the main attention kernel's launches: on two cores the
    analysis takes about as long as the longer of the two."""
    dims = [0, 1, 2] if opts.population_dim is None else [_dim_index(opts.population_dim)]
    steps = trace.step_ranges()
    with ThreadPoolExecutor(max_workers=1) as pool:
        busy_job = pool.submit(trace.busy, resolved)
        stats = trace.stats(resolved)
        family_of = _families_of(stats)
        main = _main_kernel(stats, opts, None, family_of)
        if not main:
            notes.append("no attention kernel found: attention paths and forwards are empty")
        display = {s.full: s.name for per in stats for s in per}
        labels = _labels(stats, main)
        query = MainQuery(
            main,
            display,
            opts.layers if main else None,
            dims,
            labels,
            origins=projectable(trace, steps),
        )
        mp = trace.main_pass(resolved, query)
        busy = busy_job.result()
    # the main kernel's totals split by grid, in place of its totals per name
    stats = [
        [s for s in per if s.full not in main] + split
        for per, split in zip(stats, mp.stats, strict=True)
    ]
    dim = dims[0] if opts.population_dim is not None else choose_dim(mp.distinct, [0, 0, 0])
    groupers, population = _nsys_forwards(trace, resolved, query, mp, dim, steps)
    if trace.device_map["source"] == "deviceId" and trace.has("TARGET_INFO_GPU"):
        notes.append(
            "no TARGET_INFO_CUDA_DEVICE table (an older export): kernels' deviceId (the "
            "process's CUDA device) is taken as the GPU id of TARGET_INFO_GPU"
        )
    family = _family_name(main, family_of)
    return Passes(busy, stats, main, dim, groupers, labels, family, steps, population)


def _nsys_forwards(
    trace: NsysTrace,
    resolved: Sequence[ResolvedWindow],
    query: MainQuery,
    mp: MainPass,
    dim: int | None,
    steps: Sequence[StepRange],
) -> tuple[dict[tuple[int, str], ForwardGrouper], str | None]:
    """The forwards per (window, device), and what their population is read from: the grid
    dimension `dim` ("grid"); where no grid dimension varies, vLLM's step ranges ("steps",
    servelab.profile.stepmatch.step_groupers: a persistent scheduler such as
    FlashAttention-3's on SM90 launches one grid whatever the batch); else none (dimension
    0's forwards, populations unknown)."""
    if not mp.groupers:
        return {}, None
    if dim is not None:
        return mp.groupers[dim], "grid"
    if query.origins:
        by_steps = step_groupers(trace, resolved, query, steps)
        if any(f.population is not None for g in by_steps.values() for f in g.finish().forwards):
            return by_steps, "steps"
    groupers = mp.groupers[0]
    for g in groupers.values():
        g.finish()
        g.forwards = [replace(f, population=None) for f in g.forwards]
    return groupers, None


def torch_passes(
    trace: TorchTrace, resolved: Sequence[ResolvedWindow], opts: TraceOptions, notes: list[str]
) -> Passes:
    busy, stats = trace.busy_and_stats(resolved)
    # a GPU trace's kernels come in instantiations (one kernel family); a CPU op is its name
    family_of = _families_of(stats) if trace.kind != "cpu" else None
    leaves = trace.leaf_names()
    if trace.kind != "cpu":
        # a GPU trace also holds the CPU ops that launched the kernels (aten's
        # _scaled_dot_product_flash_attention is in the attention family): kernels only
        kernels = {s.full for per in stats for s in per if s.grid is not None}
        leaves = kernels or None
    main = _main_kernel(stats, opts, leaves, family_of)
    if not main:
        notes.append("no attention kernel found: attention paths and forwards are empty")
    cpu_steps = trace.kind == "cpu"
    dim = None if cpu_steps else _population_dim(stats, main, opts.population_dim)
    groupers: dict[tuple[int, str], ForwardGrouper] = {}
    if opts.layers is not None and main:
        for i, dev, t0, t1, grid, step in trace.launches(resolved, main):
            key: object
            if cpu_steps:
                pop = step.population if step else None
                tag: object = step.start if step else ("outside", t0)
                key = step.path if step else "outside a step"
            else:
                pop = grid[dim] if grid is not None and dim is not None else None
                tag = pop
                key = grid if grid is not None else "all"
            _grouper(groupers, i, dev, opts.layers).feed(Launch(t0, t1, pop, tag, key))
    if family_of is None:
        return Passes(busy, stats, main, dim, groupers, {}, None, population="step")
    labels = _labels(stats, main)
    family = _family_name(main, family_of)
    population = None if dim is None else "grid"
    return Passes(busy, stats, main, dim, groupers, labels, family, population=population)


def _dim_index(name: str) -> int:
    if name not in DIMS:
        raise ServelabError(f"--population-dim {name!r}: use one of x, y, z")
    return DIMS.index(name)


def _grouper(
    groupers: dict[tuple[int, str], ForwardGrouper], i: int, dev: str, layers: int
) -> ForwardGrouper:
    g = groupers.get((i, dev))
    if g is None:
        g = groupers[(i, dev)] = ForwardGrouper(layers)
    return g


def _population_dim(
    stats: Sequence[Sequence[KernelStat]], main: set[str], override: str | None
) -> int | None:
    if override is not None:
        return _dim_index(override)
    distinct: list[set[int]] = [set(), set(), set()]
    for per in stats:
        for s in per:
            if s.full in main and s.grid is not None:
                for d in range(3):
                    distinct[d].add(s.grid[d])
    return choose_dim(distinct, [0, 0, 0])
