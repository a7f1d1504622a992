"""What `servelab trace stats` prints about a trace window: its rate and lengths
(servelab.workload.trace_stats), the prefix reuse the trace implies at its block size
(servelab.workload.trace.intended_reuse), and how many of its requests fit a server's
max-model-len (input + output), as recorded and at length scales (servelab.workload.trace
.scale_row), with the largest scale 1/d (d a divisor of block_tokens) that keeps FIT_SHARE of
them fitting. A failed request counts in the rate and in `failed`, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from servelab.errors import ServelabError
from servelab.experiment.workload import block_divisors, scaled_block_tokens
from servelab.workload.trace import TraceReuse, intended_reuse, read_trace, scale_row
from servelab.workload.trace_formats import FORMATS, TraceRow
from servelab.workload.trace_stats import (
    QUANTILES,
    Lengths,
    RateBin,
    Span,
    busiest_start_ms,
    rate_bins,
    seconds_text,
)

FIT_SHARE = 0.95  # the share of requests a suggested length scale keeps fitting


def read_rows(path: Path, fmt: str = "auto") -> list[TraceRow]:
    """The requests of a trace file in format `fmt` (auto, or one of
    servelab.workload.trace_formats.FORMATS; servelab.workload.trace.read_trace); a missing
    or unreadable file or an unknown format is a one-line error."""
    if fmt not in ("auto", *FORMATS):
        raise ServelabError(f"--format {fmt}: give auto or one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise ServelabError(f"{path}: no such trace file; give the path of a trace file")
    try:
        return read_trace(path, fmt)
    except OSError as exc:
        raise ServelabError(f"{path}: cannot read the trace ({exc.strerror})") from None


# --- the fit to max-model-len ----------------------------------------------------------------


@dataclass(frozen=True)
class FitCount:
    """How many of `total` requests fit max-model-len at a length scale (None: as recorded);
    `error`, instead, when the scale does not keep blocks whole."""

    scale: float | None
    fitting: int
    total: int
    error: str | None = None

    @property
    def share(self) -> float:
        return self.fitting / self.total if self.total else 0.0


def fitting(rows: Sequence[TraceRow], max_model_len: int, scale: float = 1.0) -> int:
    """The requests whose input + output, at length `scale` (scale_row), is at most
    max_model_len."""
    return sum(
        1
        for r in rows
        if (s := scale_row(r, scale)).input_length + s.output_length <= max_model_len
    )


def fit_at(
    rows: Sequence[TraceRow], block_tokens: int, max_model_len: int, scale: float
) -> FitCount:
    """The fit at one length scale, or the error that the scale cuts blocks."""
    try:
        scaled_block_tokens(block_tokens, scale)
    except ServelabError as exc:
        return FitCount(scale, 0, len(rows), str(exc))
    return FitCount(scale, fitting(rows, max_model_len, scale), len(rows))


def suggest_divisor(
    rows: Sequence[TraceRow], block_tokens: int, max_model_len: int, share: float = FIT_SHARE
) -> tuple[int, FitCount]:
    """The smallest divisor d of block_tokens whose length scale 1/d keeps at least `share` of
    the requests fitting (the largest such scale) with its fit; when none does, block_tokens
    itself (the smallest scale) with its fit."""
    fit = FitCount(1.0, 0, len(rows))
    for d in block_divisors(block_tokens):
        fit = FitCount(1 / d, fitting(rows, max_model_len, 1 / d), len(rows))
        if fit.share >= share:
            return d, fit
    return block_tokens, fit


# --- the statistics ---------------------------------------------------------------------


@dataclass(frozen=True)
class StatsOptions:
    """What `trace stats` computes beside the rate and lengths: `block_tokens` of the prefix
    ids, the busiest window's length, and the fit to `max_model_len` at each of `scales`."""

    block_tokens: int = 512
    busiest_s: float = 60.0
    max_model_len: int | None = None
    scales: tuple[float, ...] = ()


@dataclass(frozen=True)
class TraceStats:
    """A window's statistics (`summarize`)."""

    span: Span
    requests: int
    failed: int
    bins: list[RateBin]
    busiest_s: float
    busiest_start_ms: int | float
    busiest_requests: int
    input: Lengths | None
    output: Lengths | None
    reuse: TraceReuse | None  # None: no request carries prefix ids
    fits: list[FitCount] = field(default_factory=list)
    suggestion: tuple[int, FitCount] | None = None

    @property
    def rate(self) -> float | None:
        """The window's requests per second (None for a window of no length)."""
        d = self.span.duration_ms
        return float(self.requests / (d / 1000)) if d else None


def summarize(rows: Sequence[TraceRow], span: Span, opts: StatsOptions) -> TraceStats:
    """The statistics of the window's requests `rows` (trace_stats.choose_window)."""
    sent = [r for r in rows if not r.failed]
    start = busiest_start_ms(rows, opts.busiest_s)
    width = Fraction(opts.busiest_s) * 1000
    in_busiest = sum(1 for r in rows if 0 <= Fraction(r.timestamp) - Fraction(start) < width)
    fits: list[FitCount] = []
    suggestion = None
    if opts.max_model_len is not None:
        fits.append(FitCount(None, fitting(sent, opts.max_model_len), len(sent)))
        fits += [fit_at(sent, opts.block_tokens, opts.max_model_len, s) for s in opts.scales]
        suggestion = suggest_divisor(sent, opts.block_tokens, opts.max_model_len)
    with_ids = any(r.hash_ids is not None for r in sent)
    return TraceStats(
        span=span,
        requests=len(rows),
        failed=len(rows) - len(sent),
        bins=rate_bins(rows, span),
        busiest_s=opts.busiest_s,
        busiest_start_ms=start,
        busiest_requests=in_busiest,
        input=Lengths.of([r.input_length for r in sent]),
        output=Lengths.of([r.output_length for r in sent]),
        reuse=intended_reuse(sent, opts.block_tokens) if with_ids else None,
        fits=fits,
        suggestion=suggestion,
    )


# --- the text ------------------------------------------------------------------------------


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def reuse_text(reuse: TraceReuse | None) -> str:
    """The reuse line: requests with reuse and the reuse ratio, or that there is none."""
    if reuse is None:
        return "no prefix ids: no reuse recorded"
    ratio = "-" if reuse["reuse_ratio"] is None else f"{reuse['reuse_ratio']:.4f}"
    return (
        f"{reuse['requests_with_reuse']:,} of {reuse['requests']:,} requests reuse a prefix; "
        f"reuse ratio {ratio} ({reuse['reused_tokens']:,} of {reuse['prompt_tokens']:,} "
        f"prompt tokens, block_tokens {reuse['block_tokens']})"
    )


def _lengths_lines(st: TraceStats) -> list[str]:
    head = "".join(f"{f'p{p}':>9}" for p in QUANTILES)
    out = [f"lengths (tokens){head}{'max':>9}{'mean':>11}"]
    for name, ln in (("input", st.input), ("output", st.output)):
        if ln is None:
            out.append(f"  {name:<14}  (no request sent)")
            continue
        qs = "".join(f"{ln.quantiles[p]:>9,}" for p in QUANTILES)
        out.append(f"  {name:<14}{qs}{ln.max:>9,}{ln.mean:>11,.1f}")
    return out


def _fit_lines(st: TraceStats, max_model_len: int) -> list[str]:
    out = [f"fits max-model-len {max_model_len:,} (input + output <= {max_model_len:,})"]
    for f in st.fits:
        name = "as recorded" if f.scale is None else f"length_scale {f.scale:g}"
        if f.error is not None:
            out.append(f"  {name:<24}{f.error}")
        else:
            out.append(f"  {name:<24}{f.fitting:>9,} of {f.total:,} ({100 * f.share:.1f}%)")
    if st.suggestion is not None:
        d, fit = st.suggestion
        if fit.share >= FIT_SHARE:
            out.append(
                f"  suggestion: length_scale {1 / d:g} (1/{d}), the largest 1/d keeping "
                f"{100 * FIT_SHARE:g}% fitting: {fit.fitting:,} ({100 * fit.share:.1f}%)"
            )
        else:
            out.append(
                f"  suggestion: none; no length_scale 1/d keeps {100 * FIT_SHARE:g}% fitting "
                f"(1/{d}: {100 * fit.share:.1f}%); a longer max-model-len"
            )
    return out


def stats_text(st: TraceStats, max_model_len: int | None = None) -> str:
    """The statistics as `servelab trace stats` prints them."""
    sp = st.span
    out = [
        f"window: {st.span.label}, {seconds_text(sp.start_ms)}-"
        f"{seconds_text(sp.start_ms + sp.duration_ms)} s: "
        f"{st.requests:,} requests, {_rate(st.rate)} req/s"
        + (f"; failed (recorded without response): {st.failed:,}" if st.failed else ""),
        f"busiest {st.busiest_s:g} s: from {seconds_text(st.busiest_start_ms)} s, "
        f"{st.busiest_requests:,} requests ({st.busiest_requests / st.busiest_s:.2f} req/s)",
        "",
        f"{'minute':>6}{'requests':>10}{'req/s':>8}",
    ]
    out += [f"{b.minute:>6}{b.requests:>10,}{_rate(b.rate):>8}" for b in st.bins]
    out += ["", *_lengths_lines(st), "", "prefix reuse: " + reuse_text(st.reuse)]
    if max_model_len is not None:
        out += ["", *_fit_lines(st, max_model_len)]
    return "\n".join(out) + "\n"
