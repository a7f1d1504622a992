"""`servelab profile analyze`: a trace and its windows in, profile.json and tables out.

The passes over the trace are servelab.profile.passes (TraceOptions, how a trace is analyzed,
is defined there and used from here); vLLM's steps are matched to the forwards by
servelab.profile.stepmatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servelab.documents.declared import (
    ForwardsInfo,
    ProfileRecord,
    ProfileSettings,
    RatioRow,
    Steady,
    TraceGpu,
    Verdict,
    WindowEntry,
)
from servelab.errors import ServelabError
from servelab.profile.codepaths import (
    PathSplit,
    localise,
    path_ratios,
    paths_table,
    scaling_dims,
    steady_paths,
)
from servelab.profile.forwards import DIMS, Forward, ratios, steady_summary
from servelab.profile.gpumatch import match_gpus
from servelab.profile.kernels import classify, families_table, kernels_table
from servelab.profile.nsys import NsysTrace, is_sqlite
from servelab.profile.passes import (
    Passes,
    TraceOptions,
    instantiations,
    nsys_passes,
    torch_passes,
)
from servelab.profile.records import KernelRow
from servelab.profile.stepmatch import nsys_steps, steps_entry
from servelab.profile.steps import StepRange
from servelab.profile.torchtrace import TorchTrace
from servelab.profile.windows import ResolvedWindow, Window, check_disjoint

__all__ = ["PROFILE_FORMAT_VERSION", "ProfileResult", "TraceOptions", "analyze_trace", "open_trace"]

# profile.json's format: 2 names attention paths by the grid dimensions that do not scale with
# the population (1 named them by the full grid) and adds the per-path steady state, the
# per-path ratios and the localisation verdict. Fields added within format 2 (optional to
# readers): settings.attention_family / attention_instantiations, attention_paths[].
# instantiations, steady.paths[].first / last / below_minimum, idle_gpus, steps,
# trace.device_map (and its cuda_devices[].uuid / by), trace.nvtx, trace.gpus,
# no_kernel_activity, and population_dim "step" on an nsys trace.
PROFILE_FORMAT_VERSION = 2


@dataclass
class ProfileResult:
    profile: ProfileRecord
    kernels: dict[str, list[KernelRow]]
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
        passes = nsys_passes(trace, resolved, opts, notes)
    else:
        passes = torch_passes(trace, resolved, opts, notes)
    dim_name = _population_name(passes, notes)
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
        step_of = nsys_steps(trace, resolved, passes.steps, passes.groupers, info, notes)
    per = _window_results(resolved, ctx, step_of, notes)
    if isinstance(trace, NsysTrace):
        info["gpus"] = _trace_gpus(trace, passes, opts, notes)
    order = [w.label for w in windows]
    ratio_rows, verdicts = _between_windows(windows, per.entries, ctx, dim_name is not None)
    profile: ProfileRecord = {
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


def _trace_gpus(
    trace: NsysTrace, passes: Passes, opts: TraceOptions, notes: list[str]
) -> list[TraceGpu]:
    """trace.gpus: the trace's GPUs with their UUIDs, matched to the telemetry's GPUs
    (servelab.profile.gpumatch)."""
    active = {d for per in passes.busy for d, b in per.items() if b > 0}
    uuids = trace.gpu_uuids()
    gpus = {g: (name, uuids.get(g)) for g, name in trace.devices().items()}
    if opts.telemetry_gpus is None and active:
        notes.append(
            "the telemetry's GPUs were not given: GPUs are named by the trace's ids "
            "(TARGET_INFO_GPU.id; inside a container nsys numbers the GPUs it sees from 0), "
            "trace.gpus has their UUIDs"
        )
    return match_gpus(gpus, active, opts.telemetry_gpus, notes)


def _population_name(passes: Passes, notes: list[str]) -> str | None:
    """The name of what carries the population: the grid dimension found or given, the
    engine step (a CPU trace's, or on nsys vLLM's step ranges where no grid dimension varies),
    or None (with a note when an attention kernel was found)."""
    if passes.dim is not None:
        return DIMS[passes.dim]
    if passes.population == "steps":
        notes.append(
            "no grid dimension of the main attention kernel varies (a persistent scheduler, "
            "such as FlashAttention-3's on SM90, launches a grid of the SM count whatever the "
            "batch): each forward's population is the request count of the vLLM step (NVTX "
            "range) that launched it"
        )
        return "step"
    if passes.population == "step":
        return "step"
    if passes.main:
        notes.append(
            "no grid dimension of the main attention kernel varies and no vLLM step range "
            "(NVTX) could be traced to its launches: populations are unknown (profile two "
            "concurrencies, or pass --population-dim)"
        )
    return None


def _settings(
    ctx: WindowContext, dim_name: str | None, split_source: str | None
) -> ProfileSettings:
    """profile.json's settings: how the trace was analyzed."""
    opts, passes, display = ctx.opts, ctx.passes, ctx.passes.display
    return {
        "layers": opts.layers,
        "layers_source": opts.layers_source,
        "families": [[f.name, f.pattern.pattern] for f in opts.families],
        "attention_kernel": sorted({display.get(n, n) for n in passes.main}),
        "attention_family": passes.family,
        "attention_instantiations": instantiations(passes),
        "population_dim": dim_name,
        "band": opts.band,
        "path_dims": None if split_source is None else ctx.split.dim_names(),
        "path_dims_source": split_source,
    }


@dataclass(frozen=True)
class WindowResults:
    """Per window label: its entry of profile.json, its per-kernel table, its forwards
    (device, forward) and each forward's vLLM step ((device, forward index) -> step)."""

    entries: dict[str, WindowEntry]
    kernels: dict[str, list[KernelRow]]
    forwards: dict[str, list[tuple[str, Forward]]]
    forward_steps: dict[str, dict[tuple[str, int], StepRange]]


def _window_results(
    resolved: Sequence[ResolvedWindow],
    ctx: WindowContext,
    step_of: Mapping[object, StepRange],
    notes: list[str],
) -> WindowResults:
    """Every window's entry, kernels, forwards and forwards' steps (`step_of`: a forward's
    origin -> its vLLM step; nsys only). A window in which nothing ran is flagged
    (`no_kernel_activity`) and a note says so."""
    out = WindowResults({}, {}, {}, {})
    for i, rw in enumerate(resolved):
        entry, fw = _window_entry(i, rw, ctx)
        entry["no_kernel_activity"] = not any(b > 0 for b in ctx.passes.busy[i].values())
        if entry["no_kernel_activity"]:
            notes.append(
                f"window {rw.label} holds no kernel activity (nothing ran in its "
                f"{rw.length_ns / 1e6:g} ms, window from {rw.source}): a point that ran missed "
                "the trace (a window mapped wrongly into the trace's clock, or outside the "
                "capture range); its figures are empty"
            )
        if ctx.physical:
            entry["steps"] = steps_entry(rw, entry, fw, ctx.passes.steps, step_of, ctx.split)
        out.entries[rw.label] = entry
        out.kernels[rw.label] = kernels_table(ctx.passes.stats[i], ctx.opts.families)
        out.forwards[rw.label] = fw
        out.forward_steps[rw.label] = {
            (d, f.index): step_of[f.origin] for d, f in fw if f.origin in step_of
        }
    return out


def _between_windows(
    windows: Sequence[Window],
    entries: Mapping[str, WindowEntry],
    ctx: WindowContext,
    population_known: bool,
) -> tuple[list[RatioRow], list[Verdict]]:
    """The steady state's ratios from window to window (all paths, then per path), and the
    localisation verdicts."""
    order = [w.label for w in windows]
    steady_by_label: dict[str, Steady | None] = {label: e["steady"] for label, e in entries.items()}
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
) -> tuple[WindowEntry, list[tuple[str, Forward]]]:
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
    forwards_info: ForwardsInfo | None = None
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
    entry: WindowEntry = {
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


def _device_key(d: str) -> tuple[int, int | str]:
    return (0, int(d)) if d.isdigit() else (1, d)
