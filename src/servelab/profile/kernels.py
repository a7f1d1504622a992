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

from servelab.documents.declared import FamilyRow
from servelab.errors import ServelabError
from servelab.profile.records import GridPathRow, KernelRow

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
) -> dict[str, FamilyRow]:
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


def kernels_table(stats: Iterable[KernelStat], families: Sequence[Family]) -> list[KernelRow]:
    """Per kernel: its family, calls and total. Kernels with a short name (nsys) are grouped
    by kernel family (kernel_family: every instantiation of one kernel, counted in
    `instantiations`); a kernel known by one name only (torch) is its own row."""
    merged: dict[tuple[str, str], list[Any]] = {}
    for s in stats:
        name = kernel_family(s.full, s.name) if s.name != s.full else s.name
        m = merged.setdefault((name, classify(s.full, families)), [0, 0, set()])
        m[0] += s.calls
        m[1] += s.total_ns
        m[2].add(s.full)
    rows: list[KernelRow] = [
        {
            "kernel": name,
            "family": family,
            "instantiations": len(fulls),
            "calls": calls,
            "total_us": total / 1000.0,
        }
        for (name, family), (calls, total, fulls) in merged.items()
    ]
    rows.sort(key=lambda r: (-r["total_us"], r["kernel"], r["family"]))
    return rows


# --- kernel families: the instantiations of one kernel --------------------------------------
#
# A templated CUDA kernel runs as several instantiations, each its own demangled name: vLLM's
# FlashAttention-2 (vllm-flash-attn, flash_api.cpp) launches
#   void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false,
#       cutlass::bfloat16_t, Flash_kernel_traits<...>>, false, false, false, false, true, true,
#       false, false>(Flash_fwd_params)
# with Is_causal false on decode-only forwards (seqlen_q == 1 turns causal off) and true on
# forwards that hold a prefill, Is_even_MN following the shapes, and so on. One kernel family
# is every instantiation of one kernel: the nsys shortName (the function's name without
# namespace, template arguments or parameters), or, where there is only a demangled name
# (torch traces), the same name cut from it. Where the short name is a generic wrapper
# (cutlass's `device_kernel<Op>`, `Kernel<Op>`, `Kernel2<Op>`, as FlashAttention-3's
# `cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>`), the
# family is the name of its first template argument, architecture guards
# (`enable_sm90_or_later<Op>`, `enable_sm80_to_sm89<Op>`) unwrapped.
GENERIC_KERNEL = re.compile(r"^(device_kernel|Kernel2?|kernel)$")
ARCH_GUARD = re.compile(r"^enable_sm\d+\w*$")


def _base_name(text: str) -> str:
    """The unqualified name of a demangled function or type: `void ns::f<...>(...)` -> f."""
    s = re.sub(r"^\s*void\s+", "", text.strip())
    head = re.split(r"[<(]", s, maxsplit=1)[0].strip()
    return head.rsplit("::", 1)[-1].strip().split(" ")[-1]


def _first_template_argument(text: str) -> str | None:
    start = text.find("<")
    if start < 0:
        return None
    depth = 0
    for i in range(start + 1, len(text)):
        c = text[i]
        if c in "<(":
            depth += 1
        elif c in ">)":
            if depth == 0:
                return text[start + 1 : i].strip()
            depth -= 1
        elif c == "," and depth == 0:
            return text[start + 1 : i].strip()
    return None


def kernel_family(full: str, short: str | None = None) -> str:
    """The family of a kernel (see above): its short name, or a generic wrapper's first
    template argument."""
    text = full
    base = short if short and short != full and not set("<(") & set(short) else _base_name(full)
    for _ in range(8):  # wrappers nest a few levels at most
        if not (GENERIC_KERNEL.match(base) or ARCH_GUARD.match(base)):
            break
        arg = _first_template_argument(text)
        if not arg:
            break
        text, base = arg, _base_name(arg)
    return base or full


def main_attention(
    totals: Mapping[str, int],
    families: Sequence[Family],
    override: str | None,
    leaves: set[str] | None = None,
    family_of: Mapping[str, str] | None = None,
) -> set[str]:
    """The full names of the main attention kernel: with `family_of` (full name -> kernel
    family), every instantiation of the attention-family kernel family with the most time
    over all windows; without it, the one name with the most time (among `leaves`, ops that
    call no other op, when given; KV-cache writes excluded). Or every name the
    --attention-kernel regex matches."""
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
    if family_of is None:
        best = max(cands, key=lambda tn: (tn[0], tn[1]))
        return {best[1]}
    by_family: dict[str, int] = {}
    for t, n in cands:
        key = family_of.get(n, n)
        by_family[key] = by_family.get(key, 0) + t
    top = max(by_family.items(), key=lambda kt: (kt[1], kt[0]))[0]
    return {n for _, n in cands if family_of.get(n, n) == top}


def paths_table(stats: Iterable[KernelStat], tokens: int | None) -> list[GridPathRow]:
    acc: dict[tuple[str, tuple[int, int, int] | None], list[int]] = {}
    for s in stats:
        key = (s.path or _grid_path(s.grid), s.grid)
        a = acc.setdefault(key, [0, 0])
        a[0] += s.calls
        a[1] += s.total_ns
    rows: list[GridPathRow] = [
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
