"""vLLM's engine steps (servelab.profile.steps) matched to the forwards an nsys trace holds:
each forward's first launch traced to the CUDA API call that made it and so to the step range
enclosing that call, and per window the record of how the steps and the forwards agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from servelab.documents.declared import StepsEntry, TraceInfo, WindowEntry
from servelab.profile.codepaths import PathSplit
from servelab.profile.forwards import Forward, ForwardGrouper, Launch
from servelab.profile.nsys import KERNEL, RUNTIME, NsysTrace
from servelab.profile.nsys_main import MainQuery, main_launches, main_origins, name_ids
from servelab.profile.steps import StepIndex, StepRange
from servelab.profile.windows import ResolvedWindow


def projectable(trace: NsysTrace, steps: Sequence[StepRange]) -> bool:
    """Whether vLLM's steps can be traced onto the GPU: step ranges, the launches' host calls
    (the runtime table) and the kernels' process and correlation ids."""
    return (
        bool(steps)
        and trace.has(RUNTIME)
        and {"globalPid", "correlationId"} <= trace.columns(KERNEL)
    )


def nsys_steps(
    trace: NsysTrace,
    resolved: Sequence[ResolvedWindow],
    steps: Sequence[StepRange],
    groupers: Mapping[tuple[int, str], ForwardGrouper],
    info: TraceInfo,
    notes: list[str],
) -> dict[object, StepRange]:
    """What NVTX the trace holds (trace.nvtx), and each forward's vLLM step: the step range,
    on the launching thread, that encloses the host call which launched the forward's first
    attention kernel (its origin)."""
    projected = projectable(trace, steps)
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
        f.origin for g in groupers.values() for f in g.forwards if isinstance(f.origin, tuple)
    ]
    index = StepIndex(steps)
    out: dict[object, StepRange] = {}
    for origin, (tid, at) in trace.launch_hosts(origins).items():
        st = index.at(tid, at)
        if st is not None:
            out[origin] = st
    return out


def steps_entry(
    rw: ResolvedWindow,
    entry: WindowEntry,
    fw: Sequence[tuple[str, Forward]],
    steps: Sequence[StepRange],
    step_of: Mapping[object, StepRange],
    split: PathSplit,
) -> StepsEntry | None:
    """vLLM's steps against the kernel-derived forwards of the window's reported device
    (`forwards.device`): how many forwards a step range launched (one each, when the layer
    count and the forwards are right), steps that launched none, and the step's batch
    composition beside the population read from the attention grid."""
    if not steps:
        return None
    forwards = entry.get("forwards")
    device = forwards.get("device") if forwards else None
    mine = [f for d, f in fw if d == device]
    in_window = [st for st in steps if st.start < rw.hi and st.end > rw.lo and st.requests > 0]
    out: StepsEntry = {
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


def step_groupers(
    trace: NsysTrace,
    resolved: Sequence[ResolvedWindow],
    query: MainQuery,
    steps: Sequence[StepRange],
) -> dict[tuple[int, str], ForwardGrouper]:
    """Forwards per (window, device) whose population is their vLLM step's request count, for
    a main attention kernel whose grid does not follow the batch (FlashAttention-3's persistent
    scheduler on SM90 launches a grid of the SM count: hopper/tile_scheduler.hpp,
    VarlenDynamicPersistentTileScheduler::get_grid_shape). Every launch is traced to the host
    call that made it (same correlationId in the same process) and so to the step range that
    encloses that call on its thread: the step is the launch's tag (a forward's layers lie in
    one step, which also aligns a forward cut by the window's start) and its request count
    the population. A launch outside every step keeps a tag of its own and no population.

    The launches' distinct origins are read first (one per launch, one per CUDA-graph replay),
    then the launches themselves, streamed in order of GPU and start."""
    layers = query.layers
    ids = name_ids(trace, sorted(query.full_names))
    if layers is None or not ids or not resolved:
        return {}
    labels = query.labels or {}
    lab = {i: labels[v] for i, v in ids.items() if v in labels}
    if len(ids) < 2 or len(lab) != len(ids):
        lab = {}
    index = StepIndex(steps)
    step_of: dict[tuple[int, int], StepRange] = {}
    for origin, (tid, at) in trace.launch_hosts(main_origins(trace, resolved, ids)).items():
        st = index.at(tid, at)
        if st is not None:
            step_of[origin] = st
    groupers: dict[tuple[int, str], ForwardGrouper] = {}
    cur = main_launches(trace, resolved, ids, True, True)
    while rows := cur.fetchmany(8192):
        for w, n, d, s, e, gx, gy, gz, p, c in rows:
            origin = (p, c)
            st = step_of.get(origin)
            tag: object = (st.tid, st.start) if st is not None else ("outside", p, c)
            key = (gx, gy, gz, lab[n]) if lab else (gx, gy, gz)
            g = groupers.get((w, str(d)))
            if g is None:
                g = groupers[(w, str(d))] = ForwardGrouper(layers)
            g.feed(Launch(s, e, st.requests if st is not None else None, tag, key, origin))
    return groupers
