"""A synthetic request trace with a source window's statistics (`servelab trace synth`), at a
chosen mean rate and duration, seeded: the same source, rate, duration and seed give the same
bytes. It is written in the Mooncake format (servelab.workload.trace).

The method, over the source window's requests that a replay sends (not the failed ones):

- Arrivals: n = round(rate x duration) requests. n gaps are drawn, with replacement, from the
  source's gaps between consecutive requests (the last, which closes the window, from its
  gaps above 0), and all scaled by one factor so that they sum to the duration: request i
  arrives at the sum of the first i gaps, floored to the ms. The mean rate is n / duration
  exactly, the gaps' shape (bursts, same-ms arrivals) is the source's.
- Lengths and blocks: each request copies one source request drawn with replacement: its
  input and output lengths together, its number of prefix ids (none: the plain form), and the
  tokens an earlier request of the source had sent of its prefix (`trace.reuse_per_row`, the reuse
  servelab.workload.trace.intended_reuse counts). A request that reused h tokens starts with
  the first ceil(h / block_tokens) ids of the latest earlier synthetic request that sent at
  least h tokens of its blocks (failing one, of the one that sent the most), and its other
  blocks get new ids. So the implied reuse ratio follows the source's: each request reuses
  about what the request it copies did.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise

from servelab.errors import ServelabError
from servelab.workload.trace import blocks_of, reuse_per_row
from servelab.workload.trace_formats import TraceRow
from servelab.workload.trace_stats import Span
from servelab.workload.trace_summary import StatsOptions, TraceStats, summarize


@dataclass(frozen=True)
class SynthPlan:
    """What to synthesize: `rate` requests per second on average over `duration_s` seconds,
    from `seed`, with prefix ids of `block_tokens` tokens."""

    rate: float
    duration_s: float
    seed: int = 0
    block_tokens: int = 512

    def requests(self) -> int:
        """How many requests: round(rate x duration), at least 1, else a one-line error."""
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ServelabError(f"--rate {self.rate:g}: give requests per second above 0")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ServelabError(f"--duration {self.duration_s:g}: give seconds above 0")
        n = round(self.rate * self.duration_s)
        if n < 1:
            raise ServelabError(
                f"--rate {self.rate:g} x --duration {self.duration_s:g} is under one request; "
                "raise either"
            )
        return n


def arrivals_ms(source: Sequence[TraceRow], plan: SynthPlan) -> list[int]:
    """The synthetic requests' timestamps (ms from 0): the source's gaps resampled, scaled to
    fill the duration."""
    gaps = [Fraction(b.timestamp) - Fraction(a.timestamp) for a, b in pairwise(source)]
    closing = [g for g in gaps if g > 0]
    if not closing:
        raise ServelabError(
            f"the source window's {len(source)} requests arrive at one instant: no gaps to "
            "resample; choose a longer window"
        )
    n = plan.requests()
    rng = random.Random(f"{plan.seed}:synth:arrivals")
    drawn = [gaps[rng.randrange(len(gaps))] for _ in range(n - 1)]
    drawn.append(closing[rng.randrange(len(closing))])
    scale = Fraction(plan.duration_s) * 1000 / sum(drawn)
    out, at = [0], Fraction(0)
    for g in drawn[:-1]:
        at += g
        out.append(math.floor(at * scale))
    return out


class _Parents:
    """The synthetic requests with prefix ids so far, for the latest that sent at least h
    tokens of its blocks: a stack whose tokens fall from bottom to top (a request hides the
    earlier ones that sent no more)."""

    def __init__(self) -> None:
        self._neg: list[int] = []  # -tokens, rising
        self._chains: list[tuple[int, ...]] = []

    def add(self, chain: tuple[int, ...], tokens: int) -> None:
        while self._neg and -self._neg[-1] <= tokens:
            self._neg.pop()
            self._chains.pop()
        self._neg.append(-tokens)
        self._chains.append(chain)

    def find(self, tokens: int) -> tuple[tuple[int, ...], int] | None:
        """The chain of the latest request that sent at least `tokens` of its blocks, and
        `tokens`; failing one, the one that sent the most, and its tokens; None when empty."""
        if not self._neg:
            return None
        i = bisect.bisect_right(self._neg, -tokens)
        if i == 0:
            return self._chains[0], -self._neg[0]
        return self._chains[i - 1], tokens


def synthesize(source: Sequence[TraceRow], plan: SynthPlan) -> list[TraceRow]:
    """The synthetic trace (the module's method) from the source window's requests."""
    source = [r for r in source if not r.failed]
    if len(source) < 2:
        raise ServelabError(
            f"the source window holds {len(source)} request(s) a replay sends; a synthetic "
            "trace needs at least 2: choose a longer window"
        )
    times = arrivals_ms(source, plan)
    hits = reuse_per_row(source, plan.block_tokens)
    rng = random.Random(f"{plan.seed}:synth:requests")
    parents, fresh = _Parents(), 0
    out: list[TraceRow] = []
    for line, t in enumerate(times, 1):
        k = rng.randrange(len(source))
        src = source[k]
        ids: tuple[int, ...] | None = None
        if src.hash_ids is not None:
            shared: tuple[int, ...] = ()
            found = parents.find(hits[k]) if hits[k] else None
            if found is not None:
                chain, tokens = found
                shared = chain[: math.ceil(tokens / plan.block_tokens)]
            new = len(src.hash_ids) - len(shared)
            ids = shared + tuple(range(fresh, fresh + new))
            fresh += new
        row = TraceRow(t, src.input_length, src.output_length, ids, line)
        if ids:
            parents.add(ids, sum(n for _, n in blocks_of(row, plan.block_tokens)))
        out.append(row)
    return out


def jsonl_bytes(rows: Sequence[TraceRow]) -> bytes:
    """The rows as a Mooncake trace: one JSON object per line (`hash_ids` left out for the
    plain form)."""
    lines = []
    for r in rows:
        obj: dict[str, object] = {
            "timestamp": r.timestamp,
            "input_length": r.input_length,
            "output_length": r.output_length,
        }
        if r.hash_ids is not None:
            obj["hash_ids"] = list(r.hash_ids)
        lines.append(json.dumps(obj) + "\n")
    return "".join(lines).encode("utf-8")


def synthetic_stats(rows: Sequence[TraceRow], plan: SynthPlan) -> TraceStats:
    """The synthetic trace's statistics over its duration."""
    span = Span(Fraction(0), Fraction(plan.duration_s) * 1000, f"0:{plan.duration_s:g}")
    return summarize(rows, span, StatsOptions(block_tokens=plan.block_tokens))


def _cells(st: TraceStats) -> list[str]:
    def q(which: str, p: int) -> str:
        ln = st.input if which == "input" else st.output
        return "-" if ln is None else f"{ln.quantiles[p]:,}"

    ratio = st.reuse["reuse_ratio"] if st.reuse is not None else None
    return [
        f"{st.requests:,}",
        "-" if st.rate is None else f"{st.rate:.3f}",
        f"{q('input', 50)} / {q('input', 90)}",
        f"{q('output', 50)} / {q('output', 90)}",
        "no prefix ids" if st.reuse is None else "-" if ratio is None else f"{ratio:.4f}",
    ]


def side_by_side(source: TraceStats, synthetic: TraceStats) -> str:
    """The source's and the synthetic trace's statistics, a line each."""
    names = ["requests", "rate (req/s)", "input p50 / p90", "output p50 / p90", "reuse ratio"]
    out = [f"{'':<18}{'source':>18}{'synthetic':>18}"]
    for name, a, b in zip(names, _cells(source), _cells(synthetic), strict=True):
        out.append(f"{name:<18}{a:>18}{b:>18}")
    return "\n".join(out) + "\n"


def pin_text(path: str, data: bytes, plan: SynthPlan) -> str:
    """The workload.trace lines that replay the written trace, pinned by its sha256."""
    digest = hashlib.sha256(data).hexdigest()
    return (
        "workload:\n"
        "  trace:\n"
        f"    path: {path}\n"
        f"    sha256: {digest}\n"
        f"    block_tokens: {plan.block_tokens}\n"
        "    start_s: 0\n"
        f"    duration_s: {_yaml_number(plan.duration_s)}\n"
    )


def _yaml_number(x: float) -> str:
    """A number as YAML reads it back (a whole number without a decimal point)."""
    return str(int(x)) if x.is_integer() else repr(x)
