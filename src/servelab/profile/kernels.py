"""Kernel families and per-kernel totals: which family a kernel belongs to, the main attention
kernel, and the per-window tables built from per-kernel totals (families, kernels, attention
paths).

Nothing here knows a trace format: the readers (nsys, torchtrace) reduce a trace to per-kernel
totals per window (`KernelStat`). Nothing is hard-coded to one model: families are regexes
(profile.families or --family replace the defaults), matched in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servelab.errors import ServelabError

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
