"""`servelab profile analyze`: a trace and its windows in, profile.json and tables out."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from servelab.errors import ServelabError
from servelab.profile.codepaths import (
    PathSplit,
    localise,
    path_ratios,
    paths_table,
    scaling_dims,
    steady_paths,
)
from servelab.profile.forwards import (
    DIMS,
    Forward,
    ForwardGrouper,
    Launch,
    choose_dim,
    ratios,
    steady_summary,
)
from servelab.profile.kernels import (
    Family,
    KernelStat,
    classify,
    default_families,
    families_table,
    kernel_family,
    kernels_table,
    main_attention,
)
from servelab.profile.nsys import KERNEL, RUNTIME, MainQuery, NsysTrace, StepRange, is_sqlite
from servelab.profile.torchtrace import TorchTrace
from servelab.profile.windows import ResolvedWindow, Window, check_disjoint

# profile.json's format: 2 names attention paths by the grid dimensions that do not scale with
# the population (1 named them by the full grid) and adds the per-path steady state, the
# per-path ratios and the localisation verdict. Fields added within format 2 (optional to
# readers): settings.attention_family / attention_instantiations, attention_paths[].
# instantiations, steady.paths[].first / last / below_minimum, idle_gpus, steps,
# trace.device_map and trace.nvtx.
PROFILE_FORMAT_VERSION = 2


def _default_band() -> float:
    """profile.band at its schema default."""
    from servelab.config import default_section
    from servelab.experiment import ProfileSection

    return default_section(ProfileSection, "profile").band


@dataclass
class TraceOptions:
    """How a trace is analyzed: the layer count, kernel families, the main attention kernel,
    the population dimension and the steady-state band."""

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


@dataclass
class ProfileResult:
    profile: dict[str, Any]
    kernels: dict[str, list[dict[str, Any]]]
    forwards: dict[str, list[tuple[str, Forward]]]
    split: PathSplit = field(default_factory=lambda: PathSplit(()))  # launch key -> path
    # per window: (device, forward index) -> the vLLM step (NVTX range) that launched it
    forward_steps: dict[str, dict[tuple[str, int], StepRange]] = field(default_factory=dict)


def open_trace(paths: Sequence[Path]) -> NsysTrace | TorchTrace:
    if not paths:
        raise ServelabError("no trace given")
    for p in paths:
        if not p.is_file():
            raise ServelabError(f"{p}: file not found")
    kinds = [is_sqlite(p) for p in paths]
    if all(kinds):
        if len(paths) > 1:
            raise ServelabError(
                f"{paths[1]}: give one nsys SQLite export at a time (one per profile run)"
            )
        return NsysTrace(paths[0])
    if any(kinds):
        raise ServelabError(
            f"{paths[kinds.index(True)]}: do not mix an nsys SQLite export with torch traces"
        )
    return TorchTrace(paths)


def analyze_trace(
    paths: Sequence[Path], windows: Sequence[Window], opts: TraceOptions
) -> ProfileResult:
    if not windows:
        raise ServelabError("the windows file lists no window")
    trace = open_trace(paths)
    try:
        return _analyze(trace, paths, windows, opts)
    finally:
        if isinstance(trace, NsysTrace):
            trace.close()


def _analyze(
    trace: NsysTrace | TorchTrace,
    paths: Sequence[Path],
    windows: Sequence[Window],
    opts: TraceOptions,
) -> ProfileResult:
    """The passes over the trace, then each window's entry, then the comparisons between
    windows; the notes in the order the steps make them."""
    resolved = check_disjoint(trace.resolve(windows), str(paths[0]))
    notes: list[str] = []
    nsys = isinstance(trace, NsysTrace)
    if isinstance(trace, NsysTrace):
        passes = _nsys_passes(trace, resolved, opts, notes)
    else:
        passes = _torch_passes(trace, resolved, opts, notes)
    dim_name = _population_name(trace, passes, notes)
    if opts.layers is None:
        notes.append("layer count unknown (pass --layers or --model-config): no forwards")
    for g in passes.groupers.values():
        g.finish()
    split, split_source = _path_split(trace, passes, opts)
    ctx = WindowContext(passes, dict(trace.devices()), opts, split, physical=nsys)
    info = trace.info()
    info["files"] = [p.name for p in paths]
    step_of: dict[object, StepRange] = {}
    if isinstance(trace, NsysTrace):
        step_of = _nsys_steps(trace, resolved, passes, info, notes)
    per = _window_results(resolved, ctx, step_of)
    order = [w.label for w in windows]
    ratio_rows, verdicts = _between_windows(windows, per.entries, ctx, dim_name is not None)
    profile = {
        "format_version": PROFILE_FORMAT_VERSION,
        "status": "profiled",
        "reason": None,
        "trace": info,
        "settings": _settings(ctx, dim_name, split_source),
        "windows": {label: per.entries[label] for label in order},
        "ratios": ratio_rows,
        "localisation": verdicts,
        "notes": notes,
    }
    return ProfileResult(profile, per.kernels, per.forwards, split, per.forward_steps)


def _population_name(trace: NsysTrace | TorchTrace, passes: Passes, notes: list[str]) -> str | None:
    """The name of what carries the population: the grid dimension found or given, a CPU
    trace's engine steps, or None (with a note when an attention kernel was found)."""
    name = "step" if isinstance(trace, TorchTrace) and trace.kind == "cpu" else None
    if passes.dim is not None:
        return DIMS[passes.dim]
    if passes.main and name is None:
        notes.append(
            "no grid dimension of the main attention kernel varies: populations are "
            "unknown (profile two concurrencies, or pass --population-dim)"
        )
    return name


def _settings(ctx: WindowContext, dim_name: str | None, split_source: str | None) -> dict[str, Any]:
    """profile.json's settings: how the trace was analyzed."""
    opts, passes, display = ctx.opts, ctx.passes, ctx.passes.display
    return {
        "layers": opts.layers,
        "layers_source": opts.layers_source,
        "families": [[f.name, f.pattern.pattern] for f in opts.families],
        "attention_kernel": sorted({display.get(n, n) for n in passes.main}),
        "attention_family": passes.family,
        "attention_instantiations": _instantiations(passes),
        "population_dim": dim_name,
        "band": opts.band,
        "path_dims": None if split_source is None else ctx.split.dim_names(),
        "path_dims_source": split_source,
    }


@dataclass(frozen=True)
class WindowResults:
    """Per window label: its entry of profile.json, its per-kernel table, its forwards
    (device, forward) and each forward's vLLM step ((device, forward index) -> step)."""

    entries: dict[str, Any]
    kernels: dict[str, list[dict[str, Any]]]
    forwards: dict[str, list[tuple[str, Forward]]]
    forward_steps: dict[str, dict[tuple[str, int], StepRange]]


def _window_results(
    resolved: Sequence[ResolvedWindow], ctx: WindowContext, step_of: Mapping[object, StepRange]
) -> WindowResults:
    """Every window's entry, kernels, forwards and forwards' steps (`step_of`: a forward's
    origin -> its vLLM step; nsys only)."""
    out = WindowResults({}, {}, {}, {})
    for i, rw in enumerate(resolved):
        entry, fw = _window_entry(i, rw, ctx)
        if ctx.physical:
            entry["steps"] = _steps_entry(rw, entry, fw, ctx.passes.steps, step_of, ctx.split)
        out.entries[rw.label] = entry
        out.kernels[rw.label] = kernels_table(ctx.passes.stats[i], ctx.opts.families)
        out.forwards[rw.label] = fw
        out.forward_steps[rw.label] = {
            (d, f.index): step_of[f.origin] for d, f in fw if f.origin in step_of
        }
    return out


def _between_windows(
    windows: Sequence[Window],
    entries: Mapping[str, Any],
    ctx: WindowContext,
    population_known: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steady state's ratios from window to window (all paths, then per path), and the
    localisation verdicts."""
    order = [w.label for w in windows]
    steady_by_label: dict[str, dict[str, Any] | None] = {
        label: e["steady"] for label, e in entries.items()
    }
    ratio_rows = ratios(order, steady_by_label)
    for r in ratio_rows:
        r["paths"] = path_ratios(steady_by_label.get(r["from"]), steady_by_label.get(r["to"]))
    main = ctx.passes.main
    main_family = classify(next(iter(sorted(main))), ctx.opts.families) if main else None
    requests = {w.label: _int_or_none(w.extra.get("requests")) for w in windows}
    verdicts = localise(
        order, entries, requests, ratio_rows, main_family, population_known=population_known
    )
    return ratio_rows, verdicts


@dataclass(frozen=True)
class Passes:
    """What a reader's passes over a trace give: per window, busy time per device and the
    per-kernel totals; the main attention kernel's names (its family's instantiations, each
    with a label), the grid dimension that carries the population, the forwards per
    (window, device), and vLLM's step ranges (nsys)."""

    busy: list[dict[str, int]]
    stats: list[list[KernelStat]]
    main: set[str]
    dim: int | None
    groupers: dict[tuple[int, str], ForwardGrouper]
    labels: dict[str, str] = field(default_factory=dict)  # instantiation -> "#1", "#2", ...
    family: str | None = None
    steps: list[StepRange] = field(default_factory=list)

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


def _instantiations(passes: Passes) -> list[dict[str, Any]]:
    acc: dict[str, list[int]] = {}
    for per in passes.stats:
        for s in per:
            if s.full in passes.labels:
                a = acc.setdefault(s.full, [0, 0])
                a[0] += s.calls
                a[1] += s.total_ns
    rows: list[dict[str, Any]] = [
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


def _nsys_passes(
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
            origins=bool(steps)
            and trace.has(RUNTIME)
            and {"globalPid", "correlationId"} <= trace.columns(KERNEL),
        )
        mp = trace.main_pass(resolved, query)
        busy = busy_job.result()
    # the main kernel's totals split by grid, in place of its totals per name
    stats = [
        [s for s in per if s.full not in main] + split
        for per, split in zip(stats, mp.stats, strict=True)
    ]
    dim = dims[0] if opts.population_dim is not None else choose_dim(mp.distinct, [0, 0, 0])
    groupers: dict[tuple[int, str], ForwardGrouper] = {}
    if mp.groupers:
        groupers = mp.groupers[0 if dim is None else dim]
        if dim is None:  # no dimension varies: dimension 0's forwards, populations unknown
            for g in groupers.values():
                g.finish()
                g.forwards = [replace(f, population=None) for f in g.forwards]
    if trace.device_map["source"] == "deviceId" and trace.has("TARGET_INFO_GPU"):
        notes.append(
            "no TARGET_INFO_CUDA_DEVICE table (an older export): kernels' deviceId (the "
            "process's CUDA device) is taken as the GPU id of TARGET_INFO_GPU"
        )
    return Passes(busy, stats, main, dim, groupers, labels, _family_name(main, family_of), steps)


def _torch_passes(
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
        return Passes(busy, stats, main, dim, groupers, {}, None)
    labels = _labels(stats, main)
    return Passes(busy, stats, main, dim, groupers, labels, _family_name(main, family_of))


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _path_split(
    trace: NsysTrace | TorchTrace, passes: Passes, opts: TraceOptions
) -> tuple[PathSplit, str | None]:
    """How launches map to attention paths, and where that came from: the grid dimensions
    given (--path-dims, profile.path_dims), or those that do not scale with the population,
    found from the forwards. A CPU trace's paths are its engine-step kinds (no grid)."""
    if isinstance(trace, TorchTrace) and trace.kind == "cpu":
        return PathSplit(()), None
    if opts.path_dims is not None:
        dims, source = opts.path_dims, opts.path_dims_source or "given"
    else:
        forwards = [f for g in passes.groupers.values() for f in g.forwards]
        scaling = scaling_dims(forwards, passes.dim)
        dims, source = tuple(d for d in range(3) if d not in scaling), "found"
    # grid paths that hold several instantiations are split by instantiation (nsys: the
    # launches carry their instantiation; a torch trace's launches do not)
    held: dict[str, set[str]] = {}
    plain = PathSplit(dims)
    for per in passes.stats:
        for s in per:
            if s.full in passes.labels and s.grid is not None:
                held.setdefault(plain.of_grid(s.grid), set()).add(passes.labels[s.full])
    split = frozenset(p for p, ls in held.items() if len(ls) > 1)
    if not isinstance(trace, NsysTrace) or not dims:  # --path-dims none: one path, all
        split = frozenset()
    return PathSplit(dims, dict(passes.labels), split), source


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


@dataclass(frozen=True)
class WindowContext:
    """What every window's entry is made from: the passes over the trace, the trace's devices
    (id -> name), the options and the launches' attention paths. With `physical` (nsys:
    `devices` lists every GPU of the host), the active fraction covers the GPUs that ran a
    kernel in the window, and the others are listed as idle."""

    passes: Passes
    devices: dict[str, str]
    opts: TraceOptions
    split: PathSplit
    physical: bool = False


def _window_entry(
    i: int, rw: ResolvedWindow, ctx: WindowContext
) -> tuple[dict[str, Any], list[tuple[str, Forward]]]:
    """Window i's entry of profile.json, and its forwards."""
    passes, devices, opts, split = ctx.passes, ctx.devices, ctx.opts, ctx.split
    busy, stats, main, display = passes.busy[i], passes.stats[i], passes.main, passes.display
    length = rw.length_ns
    idle: list[str] = []
    if ctx.physical:
        devs = sorted((d for d, b in busy.items() if b > 0), key=_device_key)
        idle = sorted(set(devices) - set(devs), key=_device_key)
    else:
        devs = sorted(set(devices) | set(busy), key=_device_key)
    active = {d: busy.get(d, 0) / length for d in devs}
    mine = sorted(
        ((d, g) for (w, d), g in passes.groupers.items() if w == i),
        key=lambda t: _device_key(t[0]),
    )
    fw = [(d, f) for d, g in mine for f in g.forwards]
    first = next(((d, g) for d, g in mine if g.forwards), None)
    layers = opts.layers or 1
    forwards_info = None
    steady = None
    first_forwards: list[Forward] = []
    if first is not None:
        d0, g0 = first
        first_forwards = g0.forwards
        forwards_info = {
            "device": d0,
            "count": len(g0.forwards),
            "layers": g0.layers,
            "launches": g0.launches,
            "offset": g0.offset,
            "violations": g0.violations,
            "path_splits": sum(1 for f in g0.forwards if split.of_key(f.key) is None),
        }
        steady = steady_summary(g0.forwards, layers, opts.band)
        if steady is not None:
            steady["paths"] = steady_paths(g0.forwards, layers, split, opts.band)
    main_stats = [s for s in stats if s.full in main]
    names = sorted({display.get(n, n) for n in main if any(s.full == n for s in stats)})
    entry = {
        "start_ns": rw.lo,
        "end_ns": rw.hi,
        "source": rw.source,
        "output_tokens": rw.output_tokens,
        "requests": rw.requests,
        "length_us": length / 1000.0,
        "coverage": rw.coverage,
        "tokens_source": rw.tokens_source,
        "active_fraction": active,
        "idle_gpus": idle,
        "families": families_table(stats, opts.families, rw.output_tokens),
        "attention_kernel": ", ".join(names) if names else None,
        "attention_paths": paths_table(main_stats, rw.output_tokens, split, first_forwards, layers),
        "forwards": forwards_info,
        "steady": steady,
    }
    return entry, fw


def _nsys_steps(
    trace: NsysTrace,
    resolved: Sequence[ResolvedWindow],
    passes: Passes,
    info: dict[str, Any],
    notes: list[str],
) -> dict[object, StepRange]:
    """What NVTX the trace holds (trace.nvtx), and each forward's vLLM step: the step range,
    on the launching thread, that encloses the host call which launched the forward's first
    attention kernel (its origin)."""
    steps = passes.steps
    projected = (
        bool(steps)
        and trace.has(RUNTIME)
        and {"globalPid", "correlationId"} <= trace.columns(KERNEL)
    )
    info["nvtx"] = {
        "client_ranges": {k: v[2] for k, v in sorted(trace.client_ranges.items())},
        "step_ranges": len(steps),
        "step_formats": sorted({s.form for s in steps}),
        "steps_projected": projected,
    }
    if not trace.client_ranges and any(w.source != "trace" for w in resolved):
        notes.append(
            "the trace holds no NVTX range of the client (domain servelab): the client runs "
            "on the host, outside the server's Nsight Systems session, so windows come from "
            "its wall-clock anchors"
        )
    if steps and not projected:
        notes.append(
            "vLLM's step ranges cannot be projected onto the GPU: the export has no "
            "CUPTI_ACTIVITY_KIND_RUNTIME table (launches' host calls)"
        )
    if not projected:
        return {}
    origins = [
        f.origin
        for g in passes.groupers.values()
        for f in g.forwards
        if isinstance(f.origin, tuple)
    ]
    hosts = trace.launch_hosts(origins)
    per_thread: dict[int, list[StepRange]] = {}
    for st in steps:  # sorted by thread, start
        per_thread.setdefault(st.tid, []).append(st)
    starts = {t: [st.start for st in sts] for t, sts in per_thread.items()}
    out: dict[object, StepRange] = {}
    for origin, (tid, at) in hosts.items():
        sts = per_thread.get(tid)
        if not sts:
            continue
        j = bisect.bisect_right(starts[tid], at) - 1
        if j >= 0 and sts[j].start <= at < sts[j].end:
            out[origin] = sts[j]
    return out


def _steps_entry(
    rw: ResolvedWindow,
    entry: Mapping[str, Any],
    fw: Sequence[tuple[str, Forward]],
    steps: Sequence[StepRange],
    step_of: Mapping[object, StepRange],
    split: PathSplit,
) -> dict[str, Any] | None:
    """vLLM's steps against the kernel-derived forwards of the window's reported device
    (`forwards.device`): how many forwards a step range launched (one each, when the layer
    count and the forwards are right), steps that launched none, and the step's batch
    composition beside the population read from the attention grid."""
    if not steps:
        return None
    device = (entry.get("forwards") or {}).get("device")
    mine = [f for d, f in fw if d == device]
    in_window = [st for st in steps if st.start < rw.hi and st.end > rw.lo and st.requests > 0]
    out: dict[str, Any] = {
        "format": ", ".join(sorted({st.form for st in steps})),
        "ranges": len(in_window),
        "forwards": len(mine),
        "projected": bool(step_of) or not mine,
        "matched": None,
        "steps": None,
        "shared": None,
        "missed": None,
        "agree": None,
        "kinds": {},
        "population": {},
        "paths": {},
    }
    if not step_of:
        return out
    matched = [(f, step_of[f.origin]) for f in mine if f.origin in step_of]
    per_step = Counter((st.tid, st.start) for _, st in matched)
    used = set(per_step)
    missed = 0
    for tid in {st.tid for _, st in matched}:
        first = min(k[1] for k in used if k[0] == tid)
        last = max(k[1] for k in used if k[0] == tid)
        missed += sum(
            1
            for st in steps
            if st.tid == tid
            and first <= st.start <= last
            and st.requests > 0
            and (st.tid, st.start) not in used
        )
    shared = sum(1 for _, st in matched if per_step[(st.tid, st.start)] > 1)
    kinds: Counter[str] = Counter(st.kind for _, st in matched)
    population: Counter[str] = Counter()
    paths: dict[str, Counter[str]] = {}
    for f, st in matched:
        if f.population is not None:
            rel = f.population - st.requests
            population["equal" if rel == 0 else "above" if rel > 0 else "below"] += 1
        name = split.of_key(f.key)
        if name is not None:
            paths.setdefault(name, Counter())[st.kind] += 1
    out.update(
        {
            "matched": len(matched),
            "steps": len(used),
            "shared": shared,
            "missed": missed,
            "agree": len(matched) == len(mine) and shared == 0 and missed == 0,
            "kinds": dict(sorted(kinds.items())),
            "population": {k: population[k] for k in ("equal", "above", "below")},
            "paths": {p: dict(sorted(c.items())) for p, c in sorted(paths.items())},
        }
    )
    return out


def _device_key(d: str) -> tuple[int, int | str]:
    return (0, int(d)) if d.isdigit() else (1, d)
