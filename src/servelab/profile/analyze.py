"""`servelab profile analyze`: a trace and its windows in, profile.json and tables out."""

from __future__ import annotations

from collections.abc import Sequence
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
    kernels_table,
    main_attention,
)
from servelab.profile.nsys import NsysTrace, is_sqlite
from servelab.profile.torchtrace import TorchTrace
from servelab.profile.windows import ResolvedWindow, Window, check_disjoint

# profile.json's format: 2 names attention paths by the grid dimensions that do not scale with
# the population (1 named them by the full grid) and adds the per-path steady state, the
# per-path ratios and the localisation verdict.
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
    resolved = check_disjoint(trace.resolve(windows), str(paths[0]))
    notes: list[str] = []
    if isinstance(trace, NsysTrace):
        passes = _nsys_passes(trace, resolved, opts, notes)
    else:
        passes = _torch_passes(trace, resolved, opts, notes)
    main = passes.main
    dim_name = "step" if isinstance(trace, TorchTrace) and trace.kind == "cpu" else None
    if passes.dim is not None:
        dim_name = DIMS[passes.dim]
    elif main and dim_name is None:
        notes.append(
            "no grid dimension of the main attention kernel varies: populations are "
            "unknown (profile two concurrencies, or pass --population-dim)"
        )
    if opts.layers is None:
        notes.append("layer count unknown (pass --layers or --model-config): no forwards")
    for g in passes.groupers.values():
        g.finish()
    display = passes.display
    split, split_source = _path_split(trace, passes, opts)

    devices = dict(trace.devices())
    info = trace.info()
    info["files"] = [p.name for p in paths]
    out_windows: dict[str, Any] = {}
    kernels: dict[str, list[dict[str, Any]]] = {}
    forwards: dict[str, list[tuple[str, Forward]]] = {}
    steady_by_label: dict[str, dict[str, Any] | None] = {}
    for i, rw in enumerate(resolved):
        entry, fw = _window_entry(i, rw, passes, devices, opts, split)
        out_windows[rw.label] = entry
        kernels[rw.label] = kernels_table(passes.stats[i], opts.families)
        forwards[rw.label] = fw
        steady_by_label[rw.label] = entry["steady"]
    order = [w.label for w in windows]
    ratio_rows = ratios(order, steady_by_label)
    for r in ratio_rows:
        r["paths"] = path_ratios(steady_by_label.get(r["from"]), steady_by_label.get(r["to"]))
    main_family = classify(next(iter(sorted(main))), opts.families) if main else None
    requests = {w.label: _int_or_none(w.extra.get("requests")) for w in windows}
    profile = {
        "format_version": PROFILE_FORMAT_VERSION,
        "status": "profiled",
        "reason": None,
        "trace": info,
        "settings": {
            "layers": opts.layers,
            "layers_source": opts.layers_source,
            "families": [[f.name, f.pattern.pattern] for f in opts.families],
            "attention_kernel": sorted(display.get(n, n) for n in main),
            "population_dim": dim_name,
            "band": opts.band,
            "path_dims": None if split_source is None else split.dim_names(),
            "path_dims_source": split_source,
        },
        "windows": {label: out_windows[label] for label in order},
        "ratios": ratio_rows,
        "localisation": localise(
            order,
            out_windows,
            requests,
            ratio_rows,
            main_family,
            population_known=dim_name is not None,
        ),
        "notes": notes,
    }
    return ProfileResult(profile, kernels, forwards, split)


@dataclass(frozen=True)
class Passes:
    """What a reader's passes over a trace give: per window, busy time per device and the
    per-kernel totals; the main attention kernel's names, the grid dimension that carries the
    population, and the forwards per (window, device)."""

    busy: list[dict[str, int]]
    stats: list[list[KernelStat]]
    main: set[str]
    dim: int | None
    groupers: dict[tuple[int, str], ForwardGrouper]

    @cached_property
    def display(self) -> dict[str, str]:
        """Full kernel name -> the name shown (nsys shortName, torch op name)."""
        return {s.full: s.name for per in self.stats for s in per}


def _main_kernel(
    stats: Sequence[Sequence[KernelStat]], opts: TraceOptions, leaves: set[str] | None
) -> set[str]:
    totals: dict[str, int] = {}
    for per in stats:
        for s in per:
            totals[s.full] = totals.get(s.full, 0) + s.total_ns
    return main_attention(totals, opts.families, opts.attention_kernel, leaves)


def _nsys_passes(
    trace: NsysTrace, resolved: Sequence[ResolvedWindow], opts: TraceOptions, notes: list[str]
) -> Passes:
    """Busy time in a second thread (SQLite runs it outside the GIL) while this one reads the
    per-kernel totals and then the main attention kernel's launches: on two cores the
    analysis takes about as long as the longer of the two."""
    dims = [0, 1, 2] if opts.population_dim is None else [_dim_index(opts.population_dim)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        busy_job = pool.submit(trace.busy, resolved)
        stats = trace.stats(resolved)
        main = _main_kernel(stats, opts, None)
        if not main:
            notes.append("no attention kernel found: attention paths and forwards are empty")
        display = {s.full: s.name for per in stats for s in per}
        mp = trace.main_pass(resolved, main, display, opts.layers if main else None, dims)
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
    return Passes(busy, stats, main, dim, groupers)


def _torch_passes(
    trace: TorchTrace, resolved: Sequence[ResolvedWindow], opts: TraceOptions, notes: list[str]
) -> Passes:
    busy, stats = trace.busy_and_stats(resolved)
    main = _main_kernel(stats, opts, trace.leaf_names())
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
    return Passes(busy, stats, main, dim, groupers)


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
        return PathSplit(opts.path_dims), opts.path_dims_source or "given"
    forwards = [f for g in passes.groupers.values() for f in g.forwards]
    scaling = scaling_dims(forwards, passes.dim)
    return PathSplit(tuple(d for d in range(3) if d not in scaling)), "found"


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


def _window_entry(
    i: int,
    rw: ResolvedWindow,
    passes: Passes,
    devices: dict[str, str],
    opts: TraceOptions,
    split: PathSplit,
) -> tuple[dict[str, Any], list[tuple[str, Forward]]]:
    """Window i's entry of profile.json, and its forwards."""
    busy, stats, main, display = passes.busy[i], passes.stats[i], passes.main, passes.display
    length = rw.length_ns
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
            sel = g0.forwards[steady["first"] : steady["last"] + 1]
            steady["paths"] = steady_paths(sel, layers, split)
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
        "families": families_table(stats, opts.families, rw.output_tokens),
        "attention_kernel": ", ".join(names) if names else None,
        "attention_paths": paths_table(main_stats, rw.output_tokens, split, first_forwards, layers),
        "forwards": forwards_info,
        "steady": steady,
    }
    return entry, fw


def _device_key(d: str) -> tuple[int, int | str]:
    return (0, int(d)) if d.isdigit() else (1, d)
