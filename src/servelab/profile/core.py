"""Pure pieces of the profile analysis, shared by the nsys and torch-trace readers.

Nothing here knows a trace format. The readers reduce a trace to, per window: busy time per
device, per-kernel totals, and the launches of the main attention kernel in start order; these
functions turn that into kernel families, attention paths, forwards, the steady state and the
ratios between windows. Nothing is hard-coded to one model: the layer count comes from the
model's config.json (or --layers), the population dimension of the attention grid and the
alignment of forwards are found from the launches themselves.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from servelab.errors import ServelabError
from servelab.jsonio import read_json

FORMAT_VERSION = 1
CLOCKS = ("trace", "epoch")
DIMS = ("x", "y", "z")

# Ordered: the first family whose pattern matches a kernel name (searched, case-insensitive)
# takes it; "other" takes the rest. Names are matched against the demangled name, which holds
# the short name (templates and arguments too), so cutlass/cuBLAS kernels whose short name is
# a bare "Kernel2" are still recognized.
DEFAULT_FAMILIES: tuple[tuple[str, str], ...] = (
    (
        "communication",
        r"nccl|all_?reduce|all_?gather|reduce_?scatter|cross_device|custom_ar|c10d::|gloo",
    ),
    ("attention", r"attention|attn|flash|fmha|paged|flashinfer|_mla|mla_|xformers"),
    (
        "gemm",
        r"gemm|gemv|nvjet|cublas|cutlass|xmma|tensorop|matmul|onednn_mm|aten::(mm|addmm|bmm|linear)$",
    ),
    ("triton", r"triton"),
)
OTHER = "other"
# KV-cache writes sit in the attention family and run once per layer too, but the main
# attention kernel is the one that computes attention
NOT_MAIN_ATTENTION = re.compile(
    r"reshape_and_cache|concat_and_cache|cache_update|kv_cache_write", re.IGNORECASE
)
DEFAULT_BAND = 0.10
PREFIX_FORWARDS = 64  # forwards buffered per (window, device) to find the alignment


@dataclass(frozen=True)
class Family:
    name: str
    pattern: re.Pattern[str]


def families_from_pairs(pairs: Iterable[tuple[str, str]], source: str = "families") -> list[Family]:
    out: list[Family] = []
    for name, regex in pairs:
        if not name or name == OTHER:
            raise ServelabError(
                f"{source}: family name {name!r} is reserved or empty; 'other' is implicit"
            )
        try:
            out.append(Family(name, re.compile(regex, re.IGNORECASE)))
        except re.error as exc:
            raise ServelabError(f"{source}: family {name}: bad regex {regex!r} ({exc})") from None
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise ServelabError(f"{source}: a family name is used twice: {names}")
    return out


def default_families() -> list[Family]:
    return families_from_pairs(DEFAULT_FAMILIES)


def parse_family_args(args: Sequence[str]) -> list[Family]:
    """`--family NAME=REGEX` options, in order."""
    pairs = []
    for a in args:
        name, sep, regex = a.partition("=")
        if not sep:
            raise ServelabError(f"--family {a!r}: write NAME=REGEX, e.g. gemm=gemm|nvjet")
        pairs.append((name.strip(), regex))
    return families_from_pairs(pairs, "--family")


def classify(name: str, families: Sequence[Family]) -> str:
    for f in families:
        if f.pattern.search(name):
            return f.name
    return OTHER


def family_names(families: Sequence[Family]) -> list[str]:
    return [f.name for f in families] + [OTHER]


# --- windows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One diagnostic point as windows.json records it."""

    label: str
    start_ns: int
    end_ns: int
    clock: str
    output_tokens: int | None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResolvedWindow:
    """A window in the trace's own timestamps, and how it was found."""

    label: str
    lo: int
    hi: int
    source: str  # wallclock | nvtx | trace
    output_tokens: int | None
    requests: int | None = None
    coverage: float | None = None  # share of the window the trace covers (torch traces)
    tokens_source: str = "client"  # client | trace steps

    @property
    def length_ns(self) -> int:
        return self.hi - self.lo


def parse_windows(data: Any, source: str) -> list[Window]:
    if not isinstance(data, dict) or not isinstance(data.get("windows"), list):
        raise ServelabError(f'{source}: expected {{"windows": [...]}}')
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ServelabError(
            f"{source}: format_version {version!r} is not supported (this servelab reads "
            f"{FORMAT_VERSION}); recapture or upgrade servelab"
        )
    out: list[Window] = []
    for i, w in enumerate(data["windows"]):
        where = f"{source}: windows[{i}]"
        if not isinstance(w, dict):
            raise ServelabError(f"{where}: expected an object")
        for key in ("label", "start_ns", "end_ns", "clock"):
            if key not in w:
                raise ServelabError(f"{where}: missing {key!r}")
        label, start, end, clock = w["label"], w["start_ns"], w["end_ns"], w["clock"]
        if not isinstance(label, str) or not label:
            raise ServelabError(f"{where}.label: expected a non-empty string")
        if not isinstance(start, int) or not isinstance(end, int) or end <= start:
            raise ServelabError(f"{where}: start_ns and end_ns must be integers, start < end")
        if clock not in CLOCKS:
            raise ServelabError(f"{where}.clock: {clock!r} is not one of {', '.join(CLOCKS)}")
        tokens = w.get("output_tokens")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
            raise ServelabError(f"{where}.output_tokens: expected a non-negative integer")
        extra = {k: v for k, v in w.items() if k not in {"label", "start_ns", "end_ns", "clock"}}
        extra.pop("output_tokens", None)
        out.append(Window(label, start, end, clock, tokens, extra))
    labels = [w.label for w in out]
    if len(set(labels)) != len(labels):
        raise ServelabError(f"{source}: window labels must differ: {labels}")
    return out


def load_windows(path: Path) -> list[Window]:
    return parse_windows(read_json(path), str(path))


def windows_json(windows: Sequence[Window], **top: Any) -> dict[str, Any]:
    rows = []
    for w in windows:
        rows.append(
            {
                **dict(w.extra),
                "label": w.label,
                "start_ns": w.start_ns,
                "end_ns": w.end_ns,
                "clock": w.clock,
                "output_tokens": w.output_tokens,
            }
        )
    return {"format_version": FORMAT_VERSION, **top, "windows": rows}


def to_trace_clock(
    w: Window, trace_clock: str, session_start_ns: int | None, source: str
) -> tuple[int, int]:
    """Map a window into the trace's timestamps.

    An nsys trace counts from the session start unless it was exported with --ts-normalize
    (then it is epoch); TARGET_INFO_SESSION_START_TIME.utcEpochNs bridges the two.
    """
    if w.clock == trace_clock:
        return w.start_ns, w.end_ns
    if session_start_ns is None:
        raise ServelabError(
            f"{source}: window {w.label} is on the {w.clock} clock but the trace has no "
            "session start time (TARGET_INFO_SESSION_START_TIME) to bridge it; give windows "
            "on the trace's clock"
        )
    shift = -session_start_ns if w.clock == "epoch" else session_start_ns
    return w.start_ns + shift, w.end_ns + shift


def check_disjoint(windows: Sequence[ResolvedWindow], source: str) -> list[ResolvedWindow]:
    ordered = sorted(windows, key=lambda w: w.lo)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if b.lo < a.hi:
            raise ServelabError(
                f"{source}: windows {a.label} and {b.label} overlap; each kernel must belong "
                "to one window"
            )
    return ordered


# --- per-kernel totals -> families and attention paths --------------------------------------


@dataclass(frozen=True)
class KernelStat:
    """Totals of one kernel (by name, and grid when split) within one window."""

    name: str  # display name (nsys shortName, torch op name)
    full: str  # the name families are matched against (demangled name)
    calls: int
    total_ns: int
    grid: tuple[int, int, int] | None = None
    path: str | None = None


def per_token(total_ns: float, tokens: int | None) -> float | None:
    if not tokens:
        return None
    return total_ns / 1000.0 / tokens


def families_table(
    stats: Iterable[KernelStat], families: Sequence[Family], tokens: int | None
) -> dict[str, dict[str, Any]]:
    acc: dict[str, list[int]] = {name: [0, 0] for name in family_names(families)}
    for s in stats:
        a = acc[classify(s.full, families)]
        a[0] += s.calls
        a[1] += s.total_ns
    return {
        name: {
            "calls": calls,
            "total_us": total / 1000.0,
            "us_per_token": per_token(total, tokens),
        }
        for name, (calls, total) in acc.items()
    }


def kernels_table(stats: Iterable[KernelStat], families: Sequence[Family]) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str], list[int]] = {}
    for s in stats:
        m = merged.setdefault((s.name, s.full), [0, 0])
        m[0] += s.calls
        m[1] += s.total_ns
    rows: list[dict[str, Any]] = [
        {
            "kernel": name,
            "family": classify(full, families),
            "calls": calls,
            "total_us": total / 1000.0,
        }
        for (name, full), (calls, total) in merged.items()
    ]
    rows.sort(key=lambda r: (-r["total_us"], r["kernel"]))
    return rows


def main_attention(
    totals: Mapping[str, int],
    families: Sequence[Family],
    override: str | None,
    leaves: set[str] | None = None,
) -> set[str]:
    """The full names of the main attention kernel: the attention-family name with the most
    time over all windows (among `leaves`, ops that call no other op, when given; KV-cache
    writes excluded), or every name the --attention-kernel regex matches."""
    if override:
        try:
            pat = re.compile(override, re.IGNORECASE)
        except re.error as exc:
            raise ServelabError(f"--attention-kernel: bad regex {override!r} ({exc})") from None
        return {n for n in totals if pat.search(n)}
    attn = [f for f in families if "attention" in f.name]
    cands = [
        (t, n)
        for n, t in totals.items()
        if attn
        and classify(n, families) in {f.name for f in attn}
        and (leaves is None or n in leaves)
        and not NOT_MAIN_ATTENTION.search(n)
    ]
    if not cands:
        return set()
    best = max(cands, key=lambda tn: (tn[0], tn[1]))
    return {best[1]}


def paths_table(stats: Iterable[KernelStat], tokens: int | None) -> list[dict[str, Any]]:
    acc: dict[tuple[str, tuple[int, int, int] | None], list[int]] = {}
    for s in stats:
        key = (s.path or _grid_path(s.grid), s.grid)
        a = acc.setdefault(key, [0, 0])
        a[0] += s.calls
        a[1] += s.total_ns
    rows: list[dict[str, Any]] = [
        {
            "path": path,
            "grid": list(grid) if grid is not None else None,
            "calls": calls,
            "total_us": total / 1000.0,
            "us_per_token": per_token(total, tokens),
            "mean_us": total / 1000.0 / calls if calls else None,
        }
        for (path, grid), (calls, total) in acc.items()
    ]
    rows.sort(key=lambda r: (-r["total_us"], r["path"]))
    return rows


def _grid_path(grid: tuple[int, int, int] | None) -> str:
    return "x".join(map(str, grid)) if grid is not None else "all"


# --- forwards -----------------------------------------------------------------------------


class Launch(NamedTuple):
    """One launch of the main attention kernel (once per layer per forward).

    `tag` is equal for every launch of one forward when the trace is consistent: the value of
    the population dimension of the grid, or the engine step that encloses the launch.
    """

    start_ns: int
    end_ns: int
    population: int | None
    tag: object


@dataclass(frozen=True)
class Forward:
    index: int
    start_ns: int
    end_ns: int
    population: int | None
    kernel_ns: int
    consistent: bool


class ForwardGrouper:
    """Groups consecutive launches into forwards of `layers` launches, streaming.

    The first launches of a window may belong to a forward that began before it; the alignment
    (how many launches to skip) is the one with the fewest inconsistent forwards over the
    first PREFIX_FORWARDS forwards. Only that prefix is buffered.
    """

    def __init__(self, layers: int) -> None:
        if layers < 1:
            raise ServelabError(f"layer count {layers} must be at least 1")
        self.layers = layers
        self._buffer: list[Launch] | None = []
        self._current: list[Launch] = []
        self.offset = 0
        self.launches = 0
        self.forwards: list[Forward] = []

    def feed(self, launch: Launch) -> None:
        self.launches += 1
        if self._buffer is not None:
            self._buffer.append(launch)
            if len(self._buffer) >= self.layers * (PREFIX_FORWARDS + 1):
                self._settle()
            return
        self._push(launch)

    def feed_columns(
        self,
        starts: Sequence[int],
        ends: Sequence[int],
        pops: Sequence[int | None],
        tags: Sequence[object],
    ) -> None:
        """`feed` for many launches at once, given as columns (launch i is starts[i], ends[i],
        pops[i], tags[i]): the same forwards, with the work done per forward, not per launch.
        """
        n = len(starts)
        i = 0
        while self._buffer is not None and i < n:  # the prefix that finds the alignment
            self.feed(Launch(starts[i], ends[i], pops[i], tags[i]))
            i += 1
        while self._current and i < n:  # the rest of a forward begun in an earlier batch
            self.launches += 1
            self._push(Launch(starts[i], ends[i], pops[i], tags[i]))
            i += 1
        if i == n:
            return
        L = self.layers
        whole = i + (n - i) // L * L
        self.launches += n - i
        forwards = self.forwards
        for a in range(i, whole, L):
            b = a + L
            consistent = len(set(tags[a:b])) == 1
            ps = pops[a:b]
            es = ends[a:b]
            forwards.append(
                Forward(
                    index=len(forwards),
                    start_ns=starts[a],
                    end_ns=max(es),
                    population=ps[0] if consistent and len(set(ps)) == 1 else None,
                    kernel_ns=sum(es) - sum(starts[a:b]),
                    consistent=consistent,
                )
            )
        self._current = [Launch(starts[j], ends[j], pops[j], tags[j]) for j in range(whole, n)]

    def _settle(self) -> None:
        buf = self._buffer or []
        self._buffer = None
        L = self.layers
        best = 0
        best_bad = math.inf
        for off in range(min(L, max(len(buf), 1))):
            groups = [buf[i : i + L] for i in range(off, len(buf) - L + 1, L)]
            bad = sum(1 for g in groups if len({x.tag for x in g}) > 1)
            if bad < best_bad:
                best, best_bad = off, bad
        self.offset = best
        for launch in buf[best:]:
            self._push(launch)

    def _push(self, launch: Launch) -> None:
        self._current.append(launch)
        if len(self._current) == self.layers:
            g = self._current
            self._current = []
            consistent = len({x.tag for x in g}) == 1
            pops = {x.population for x in g}
            pop = g[0].population if consistent and len(pops) == 1 else None
            self.forwards.append(
                Forward(
                    index=len(self.forwards),
                    start_ns=g[0].start_ns,
                    end_ns=max(x.end_ns for x in g),
                    population=pop,
                    kernel_ns=sum(x.end_ns - x.start_ns for x in g),
                    consistent=consistent,
                )
            )

    def finish(self) -> ForwardGrouper:
        if self._buffer is not None:
            self._settle()
        self._current = []  # a trailing partial forward is cut by the window end
        return self

    @property
    def violations(self) -> int:
        return sum(1 for f in self.forwards if not f.consistent)


def choose_dim(distinct: Sequence[set[int]], violations: Sequence[int]) -> int | None:
    """The grid dimension that carries the population: one that varies across launches, with
    the fewest forwards whose layers disagree on it, then the most distinct values."""
    cands = [d for d in range(len(distinct)) if len(distinct[d]) > 1]
    if not cands:
        return None
    return min(cands, key=lambda d: (violations[d], -len(distinct[d]), d))


# --- steady state and ratios ------------------------------------------------------------------


def find_steady(pops: Sequence[int | None], band: float = DEFAULT_BAND) -> tuple[int, int] | None:
    """The longest run of forwards after the fill phase whose population stays within a band.

    The fill phase ends at the first forward whose population reaches the window's maximum
    (within the band). A run qualifies when max <= (1 + band) * min; unknown populations
    break runs. Ties go to the higher mean population, then to the earlier run.
    """
    known = [p for p in pops if p is not None and p > 0]
    if not known:
        return None
    top = max(known)
    start = next(i for i, p in enumerate(pops) if p is not None and p * (1 + band) >= top)
    best: tuple[int, float, int, int] | None = None  # (length, mean, -first, last)
    lo = start
    maxq: deque[int] = deque()
    minq: deque[int] = deque()
    total = 0
    for hi in range(start, len(pops)):
        p = pops[hi]
        if p is None or p <= 0:
            lo, total = hi + 1, 0
            maxq.clear()
            minq.clear()
            continue
        while maxq and pops[maxq[-1]] <= p:  # type: ignore[operator]
            maxq.pop()
        maxq.append(hi)
        while minq and pops[minq[-1]] >= p:  # type: ignore[operator]
            minq.pop()
        minq.append(hi)
        total += p
        while pops[maxq[0]] > (1 + band) * pops[minq[0]]:  # type: ignore[operator]
            total -= pops[lo]  # type: ignore[operator]
            lo += 1
            if maxq[0] < lo:
                maxq.popleft()
            if minq[0] < lo:
                minq.popleft()
        cand = (hi - lo + 1, total / (hi - lo + 1), -lo, hi)
        if best is None or cand[:3] > best[:3]:
            best = cand
    if best is None:
        return None
    return -best[2], best[3]


def steady_summary(
    forwards: Sequence[Forward], layers: int, band: float = DEFAULT_BAND
) -> dict[str, Any] | None:
    rng = find_steady([f.population for f in forwards], band)
    if rng is None:
        return None
    first, last = rng
    sel = forwards[first : last + 1]
    n = len(sel)
    return {
        "first": first,
        "last": last,
        "forwards": n,
        "population_mean": sum(f.population or 0 for f in sel) / n,
        "kernel_us_mean": sum(f.kernel_ns for f in sel) / 1000.0 / (n * layers),
        "forward_kernel_us_mean": sum(f.kernel_ns for f in sel) / 1000.0 / n,
        "forward_span_us_mean": sum(f.end_ns - f.start_ns for f in sel) / 1000.0 / n,
    }


def ratios(
    order: Sequence[str], steady: Mapping[str, Mapping[str, Any] | None]
) -> list[dict[str, Any]]:
    """Population and kernel-duration ratios from each window to the next."""
    out = []
    for a, b in zip(order, order[1:], strict=False):
        sa, sb = steady.get(a), steady.get(b)
        out.append(
            {
                "from": a,
                "to": b,
                "population_ratio": _ratio(sb, sa, "population_mean"),
                "duration_ratio": _ratio(sb, sa, "kernel_us_mean"),
            }
        )
    return out


def _ratio(num: Mapping[str, Any] | None, den: Mapping[str, Any] | None, key: str) -> float | None:
    if not num or not den or not den.get(key) or num.get(key) is None:
        return None
    return float(num[key]) / float(den[key])


# --- the model's layer count --------------------------------------------------------------

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def layers_from_config(path: Path) -> int:
    cfg = read_json(path)
    for node in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        if isinstance(node, dict):
            for key in _LAYER_KEYS:
                v = node.get(key)
                if isinstance(v, int) and v > 0:
                    return v
    raise ServelabError(
        f"{path}: no layer count ({', '.join(_LAYER_KEYS)}); pass --layers N instead"
    )
