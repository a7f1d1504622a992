"""Attention paths as code paths, their steady state, and the localisation verdict.

The main attention kernel runs through a few code paths (FlashAttention-2's split-KV kernel
with gridX=1 on decode-only forwards, gridX=9 on forwards that hold a prefill). Its grid also
carries the batch (one block row per sequence), so grouping launches by the full grid gives one
row per batch size. A path is named by the grid dimensions that do NOT scale with the forward's
population: the population dimension itself, and any other dimension that takes several values
and follows the population (rank correlation |rho| >= SCALING_CORRELATION), are masked
(`9x*x16`). A CPU trace has no grid: its paths are the engine-step kinds (prefill, decode,
mixed); a GPU trace without grids has one path, `all`.

The main attention kernel is a kernel family (kernels.kernel_family): every instantiation of
one kernel. Each instantiation gets a label (`#1`, `#2`, ... by total time); where one grid
path holds launches of several instantiations, the path is split by instantiation and the
label appended (`1x*x16#2`); where each grid path comes from one instantiation (FA2's causal
instantiation on forwards that hold a prefill, its non-causal one on decode-only forwards) the
grid path alone names it. Each path lists the instantiations folded into it.

Each path has its own steady state: among the path's own forwards, the run that
forwards.find_steady picks from their populations. A path rare in the window (forwards that
hold a prefill, at a low concurrency) still rests on all its forwards on the plateau, not on
those that happen to fall in one run of consecutive forwards; a path whose steady time rests on
fewer than MIN_STEADY_FORWARDS forwards is marked (`below_minimum`).

The localisation verdict splits the change in time per output token between two windows into
components (each attention path, and each kernel family with the main attention kernel taken
out of its family) and names the one that grows most. It is stated only when the windows and
the forwards were found without ambiguity; otherwise it says why not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.documents.declared import (
    AttentionPath,
    Component,
    PathRatio,
    RatioRow,
    Steady,
    SteadyPath,
    Verdict,
    WindowEntry,
)
from servelab.errors import ServelabError
from servelab.profile.forwards import DIMS, Forward, find_steady
from servelab.profile.kernels import KernelStat, per_token

SCALING_CORRELATION = 0.9  # a dimension with several values that follows the population
MIN_SCALING_VALUES = 3  # fewer distinct values than this: a path marker, never the batch
AMBIGUOUS_SHARE = 0.01  # forwards whose layers disagree: at most this share for a verdict
PROPORTION_BAND = 0.1  # elasticity within 1 +- this: "in proportion"
# A path's steady per-launch time resting on fewer of its forwards than this is marked
# (below_minimum): one forward is one batch, its layers' launches are not independent samples.
MIN_STEADY_FORWARDS = 5
ALL = "all"


@dataclass(frozen=True)
class PathSplit:
    """How a launch's key (its grid, or a name such as a CPU step kind) maps to a path.

    `dims` are the grid dimensions that name a path (in order x, y, z); the others are
    masked. A key that is already a name is its own path. `labels` maps the main attention
    kernel's instantiations (full names) to their labels; a grid path in `split` holds several
    of them and is split by instantiation (a launch key then carries the label after the grid).
    """

    dims: tuple[int, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    split: frozenset[str] = frozenset()

    def of_grid(self, grid: Sequence[object]) -> str:
        if not self.dims:
            return ALL
        return "x".join(str(grid[d]) if d in self.dims else "*" for d in range(3))

    def _labelled(self, path: str, label: object) -> str:
        return f"{path}{label}" if label is not None and path in self.split else path

    def masked(self, grid: Sequence[int] | None) -> list[int | None] | None:
        if grid is None:
            return None
        return [int(grid[d]) if d in self.dims else None for d in range(3)]

    def of_key(self, key: object) -> str | None:
        """The path of a forward's key; None when its layers disagree (no common key)."""
        if isinstance(key, tuple):
            return self._labelled(self.of_grid(key), key[3] if len(key) > 3 else None)
        if isinstance(key, str):
            return key
        return None

    def of_stat(self, s: KernelStat) -> str:
        if s.path is not None:
            return s.path
        if s.grid is None:
            return ALL
        return self._labelled(self.of_grid(s.grid), self.labels.get(s.full))

    def dim_names(self) -> list[str]:
        return [DIMS[d] for d in self.dims]


def parse_path_dims(value: str | Sequence[str] | None, source: str) -> tuple[int, ...] | None:
    """`--path-dims x,z` (or `xz`, or `none` for one path) / profile.path_dims [x, z]."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        items = [] if text in ("none", "") else [c for c in text.replace(",", "") if c != " "]
    else:
        items = [str(v).strip().lower() for v in value]
    bad = [v for v in items if v not in DIMS]
    if bad or len(set(items)) != len(items):
        raise ServelabError(
            f"{source} {value!r}: give distinct grid dimensions among x, y, z (e.g. x,z), or none"
        )
    return tuple(sorted(DIMS.index(v) for v in items))


def scaling_dims(forwards: Iterable[Forward], pop_dim: int | None) -> set[int]:
    """The grid dimensions that scale with the forward's population: the population dimension,
    and any other one that takes at least MIN_SCALING_VALUES values over the forwards and
    follows the population, up or down (Spearman |rho| >= SCALING_CORRELATION: any monotone
    function, e.g. one block row per 4 sequences or a split count chosen from the batch
    size)."""
    if pop_dim is None:
        return set()
    pops: list[float] = []
    values: list[tuple[int, ...]] = []
    for f in forwards:
        if f.population is not None and isinstance(f.key, tuple):
            pops.append(float(f.population))
            values.append(f.key)
    out = {pop_dim}
    for d in range(3):
        if d == pop_dim or not values:
            continue
        col = [float(v[d]) for v in values]
        if len(set(col)) < MIN_SCALING_VALUES:
            continue
        r = _correlation(_ranks(col), _ranks(pops))
        if r is not None and abs(r) >= SCALING_CORRELATION:
            out.add(d)
    return out


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks, ties given their mean rank (so Pearson on ranks is Spearman's rho)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def _correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    n = len(a)
    if n < 2:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    sab = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    saa = sum((x - ma) ** 2 for x in a)
    sbb = sum((y - mb) ** 2 for y in b)
    if saa == 0 or sbb == 0:
        return None
    return sab / math.sqrt(saa * sbb)


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def paths_table(
    stats: Iterable[KernelStat],
    tokens: int | None,
    split: PathSplit,
    forwards: Sequence[Forward],
    layers: int,
) -> list[AttentionPath]:
    """Per path: calls, total, µs per output token, mean duration (all its launches in the
    window), the grids and instantiations folded into it, and the slope of the per-launch
    duration on the forward's population (µs per sequence, over the path's forwards)."""
    acc: dict[str, list[Any]] = {}
    for s in stats:
        name = split.of_stat(s)
        a = acc.setdefault(name, [0, 0, set(), s.grid, set()])
        a[0] += s.calls
        a[1] += s.total_ns
        if s.grid is not None:
            a[2].add(s.grid)
        if s.full in split.labels:
            a[4].add(split.labels[s.full])
    points: dict[str, list[tuple[float, float]]] = {}
    for f in forwards:
        key = split.of_key(f.key)
        if key is not None and f.population is not None:
            points.setdefault(key, []).append((f.population, f.kernel_ns / 1000.0 / layers))
    rows: list[AttentionPath] = [
        {
            "path": name,
            "grid": split.masked(grid),
            "grids": len(grids),
            "instantiations": sorted(labels, key=_label_order),
            "calls": calls,
            "total_us": total / 1000.0,
            "us_per_token": per_token(total, tokens),
            "mean_us": total / 1000.0 / calls if calls else None,
            "slope_us_per_seq": slope(points.get(name, [])),
        }
        for name, (calls, total, grids, grid, labels) in acc.items()
    ]
    rows.sort(key=lambda r: (-r["total_us"], r["path"]))
    return rows


def _label_order(label: str) -> tuple[int, str]:
    digits = label.lstrip("#")
    return (int(digits), label) if digits.isdigit() else (1 << 30, label)


def steady_paths(
    forwards: Sequence[Forward], layers: int, split: PathSplit, band: float
) -> list[SteadyPath]:
    """Per path, its own steady state: among the path's forwards (in window order; forwards
    whose layers disagree on the path are left out), the run forwards.find_steady picks from
    their populations. `first`/`last` are window forward indices of the run's ends;
    `kernel_us_mean` is the mean duration of one launch over the run; `below_minimum` marks a
    run of fewer than MIN_STEADY_FORWARDS forwards."""
    by_path: dict[str, list[int]] = {}
    for i, f in enumerate(forwards):
        name = split.of_key(f.key)
        if name is not None:
            by_path.setdefault(name, []).append(i)
    rows: list[SteadyPath] = []
    for name, idx in by_path.items():
        rng = find_steady([forwards[i].population for i in idx], band)
        if rng is None:
            continue
        sel = [forwards[i] for i in idx[rng[0] : rng[1] + 1]]
        n = len(sel)
        rows.append(
            {
                "path": name,
                "forwards": n,
                "first": idx[rng[0]],
                "last": idx[rng[1]],
                "population_mean": sum(f.population or 0 for f in sel) / n,
                "kernel_us_mean": sum(f.kernel_ns for f in sel) / 1000.0 / (n * layers),
                "below_minimum": n < MIN_STEADY_FORWARDS,
            }
        )
    rows.sort(key=lambda r: (-r["forwards"] * r["kernel_us_mean"], r["path"]))
    return rows


def path_ratios(a: Steady | None, b: Steady | None) -> list[PathRatio]:
    """Per path in both steady states: population and per-launch duration ratios (b / a)."""
    pa = {p["path"]: p for p in (a.get("paths") if a else None) or []}
    pb = {p["path"]: p for p in (b.get("paths") if b else None) or []}
    out: list[PathRatio] = []
    for name in sorted(set(pa) & set(pb)):
        out.append(
            {
                "path": name,
                "population_ratio": _div(pb[name]["population_mean"], pa[name]["population_mean"]),
                "duration_ratio": _div(pb[name]["kernel_us_mean"], pa[name]["kernel_us_mean"]),
                "below_minimum": bool(
                    pa[name].get("below_minimum") or pb[name].get("below_minimum")
                ),
            }
        )
    return out


def _div(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return float(num) / float(den)


# --- the localisation verdict ----------------------------------------------------------------


def components(window: WindowEntry, main_family: str | None) -> dict[str, tuple[str, float | None]]:
    """A window's time per output token split into components: name -> (kind, µs/token).
    Each attention path, then each family (the main attention kernel's family without it)."""
    out: dict[str, tuple[str, float | None]] = {}
    paths = window.get("attention_paths") or []
    main_per_token = 0.0
    for p in paths:
        out[f"attention path {p['path']}"] = ("attention path", p["us_per_token"])
        main_per_token += p["us_per_token"] or 0.0
    for name, f in (window.get("families") or {}).items():
        v = f["us_per_token"]
        if name == main_family and v is not None:
            out[f"{name} (other kernels)"] = ("family", v - main_per_token)
        else:
            out[name] = ("family", v)
    return out


def ambiguities(label: str, window: WindowEntry, requests: int | None) -> list[str]:
    """Why a window cannot support a verdict (empty when it can)."""
    why = []
    if not window.get("output_tokens"):
        why.append(f"{label}: no output token count")
    if (
        window.get("source") == "nvtx"
        and requests is not None
        and window.get("requests") != requests
    ):
        why.append(
            f"{label}: the NVTX ranges hold {window.get('requests')} requests, windows.json "
            f"{requests}"
        )
    if not window.get("attention_kernel"):
        why.append(f"{label}: no launch of the main attention kernel")
    fw = window.get("forwards")
    if not fw or not fw["count"]:
        why.append(f"{label}: no forwards (layer count unknown or no attention launches)")
    else:
        n = fw["count"]
        for bad, what in (
            (fw.get("violations") or 0, "disagree on the population"),
            (fw.get("path_splits") or 0, "disagree on the attention path"),
        ):
            if bad > AMBIGUOUS_SHARE * n:
                why.append(f"{label}: {bad} of {n} forwards have layers that {what}")
    if window.get("steady") is None:
        why.append(f"{label}: no steady state")
    return why


def localise(
    order: Sequence[str],
    windows: Mapping[str, WindowEntry],
    requests: Mapping[str, int | None],
    ratios: Sequence[RatioRow],
    main_family: str | None,
    population_known: bool,
) -> list[Verdict]:
    """One verdict per pair of consecutive windows."""
    out: list[Verdict] = []
    by_pair = {(r["from"], r["to"]): r for r in ratios}
    for a, b in zip(order, order[1:], strict=False):
        wa, wb = windows[a], windows[b]
        reasons = [] if population_known else ["the population dimension is unknown"]
        reasons += ambiguities(a, wa, requests.get(a)) + ambiguities(b, wb, requests.get(b))
        ca, cb = components(wa, main_family), components(wb, main_family)
        rows: list[Component] = []
        for name in list(ca) + [n for n in cb if n not in ca]:
            kind = (ca.get(name) or cb[name])[0]
            va = ca.get(name, (kind, 0.0))[1]
            vb = cb.get(name, (kind, 0.0))[1]
            delta = vb - va if va is not None and vb is not None else None
            rows.append(
                {
                    "component": name,
                    "kind": kind,
                    "from_us_per_token": va,
                    "to_us_per_token": vb,
                    "delta_us_per_token": delta,
                    "share": None,  # of the summed deltas, below
                }
            )
        known = [r["delta_us_per_token"] for r in rows]
        total = sum(d for d in known if d is not None) if rows and None not in known else None
        for r in rows:
            d = r["delta_us_per_token"]
            r["share"] = d / total + 0.0 if d is not None and total else None  # no -0.0
        rows.sort(key=lambda r: (-(r["delta_us_per_token"] or 0.0), r["component"]))
        if total is None:
            reasons.append("time per output token unknown in a window")
        stated = not reasons
        top = rows[0] if stated and rows else None
        pr = None
        if top is not None and top["kind"] == "attention path":
            name = top["component"].removeprefix("attention path ")
            ratio = by_pair.get((a, b))
            pr = next(
                (p for p in (ratio.get("paths") if ratio else None) or [] if p["path"] == name),
                None,
            )
        out.append(
            {
                "from": a,
                "to": b,
                "stated": stated,
                "reasons": reasons,
                "delta_us_per_token": total,
                "component": top["component"] if top else None,
                "path_ratio": pr.copy() if pr else None,
                "components": rows,
                "text": _text(a, b, total, top, pr, reasons),
            }
        )
    return out


def _text(
    a: str,
    b: str,
    total: float | None,
    top: Component | None,
    pr: PathRatio | None,
    reasons: Sequence[str],
) -> str:
    head = f"{a} -> {b}:"
    if reasons or total is None or top is None:
        return f"{head} not localised ({'; '.join(reasons) or 'no components'})"
    d = top["delta_us_per_token"] or 0.0
    if d <= 0:
        return (
            f"{head} {total:+.3g} µs per output token; no component grows "
            "(every one is cheaper or unchanged per output token)"
        )
    if total > 0:
        text = (
            f"{head} {total:+.3g} µs per output token, {100 * d / total:.0f}% of it "
            f"({d:+.3g} µs) in {top['component']}"
        )
        if d > total:
            text += f" (the other components together {total - d:+.3g} µs)"
    else:
        text = (
            f"{head} {total:+.3g} µs per output token; the largest increase, {d:+.3g} µs, "
            f"is in {top['component']}"
        )
    if pr and (dr := pr.get("duration_ratio")) and (p := pr.get("population_ratio")):
        dr, p = float(dr), float(p)
        text += (
            f", whose steady per-launch time changes x{dr:.2f} as its population changes "
            f"x{p:.2f}{_proportion(dr, p)}"
        )
        if pr.get("below_minimum"):
            text += (
                f" (a steady state of fewer than {MIN_STEADY_FORWARDS} of the path's forwards: "
                "weak evidence)"
            )
    return text


def _proportion(dr: float, pr: float) -> str:
    if pr <= 0 or dr <= 0 or abs(math.log(pr)) < 1e-9:
        return ""
    e = math.log(dr) / math.log(pr)
    if abs(e - 1) <= PROPORTION_BAND:
        return " (in proportion)"
    return " (less than in proportion)" if e < 1 else " (more than in proportion)"
