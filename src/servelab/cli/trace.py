"""`servelab trace stats FILE` and `servelab trace synth FILE`: what a request trace holds
(servelab.workload.trace_stats), and a synthetic trace with its statistics at a chosen rate
(servelab.workload.trace_synth)."""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.errors import ServelabError


def _window_options(p: argparse.ArgumentParser) -> None:
    """The trace file, its format and the window, as both subcommands take them."""
    p.add_argument("file", help="the trace file (Mooncake JSON lines, Azure or BurstGPT CSV)")
    p.add_argument(
        "--format",
        default="auto",
        help="mooncake, azure or burstgpt (default auto: told from the file)",
    )
    w = p.add_mutually_exclusive_group()
    w.add_argument(
        "--window",
        metavar="START:DURATION",
        help="seconds into the trace and the window's length (600:60; 600: to the end; "
        "default the whole trace)",
    )
    w.add_argument(
        "--busiest",
        type=float,
        metavar="SECONDS",
        help="the window: the busiest SECONDS of the trace (most requests)",
    )
    p.add_argument(
        "--block-tokens",
        type=int,
        default=512,
        help="tokens of one prefix id's block (default 512, Mooncake's)",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `servelab trace stats` and `servelab trace synth` on the top-level
    subparsers."""
    t = sub.add_parser("trace", help="request traces: their statistics, a synthetic one")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    s = tsub.add_parser(
        "stats",
        help="rate per minute, busiest window, lengths, prefix reuse, fit to max-model-len",
        description="What a request trace holds over a window: the request rate per minute "
        "and its busiest 60 s (--busiest: its length), input and output length percentiles, "
        "the prefix reuse it implies, how many requests fit a max-model-len as recorded and "
        "at length scales, and the requests the trace records as failed.",
    )
    _window_options(s)
    s.add_argument(
        "--max-model-len", type=int, metavar="N", help="count the requests with input + output <= N"
    )
    s.add_argument(
        "--length-scale",
        type=float,
        nargs="+",
        default=[],
        metavar="S",
        help="with --max-model-len: the fit at each length scale too",
    )
    s.add_argument("--png", metavar="OUT.png", help="write rate and lengths over time as PNG")
    s.set_defaults(func=run_stats)
    y = tsub.add_parser(
        "synth",
        help="a seeded synthetic trace with the window's statistics at a chosen rate",
        description="Write a Mooncake-format trace with the window's inter-arrival gaps, "
        "length pairs and prefix reuse, at a mean rate over a duration, seeded; print both "
        "traces' statistics and the workload.trace lines that pin the new file.",
    )
    _window_options(y)
    y.add_argument("--out", required=True, metavar="OUT.jsonl", help="the trace to write")
    y.add_argument("--rate", type=float, required=True, help="mean requests per second")
    y.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    y.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    y.set_defaults(func=run_synth)


def _positive(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise ServelabError(f"{option} {value}: give a whole number of tokens, at least 1")


def run_stats(args: argparse.Namespace) -> int:
    from servelab.workload.trace_stats import choose_window, stats_png
    from servelab.workload.trace_summary import StatsOptions, read_rows, stats_text, summarize

    _positive(args.block_tokens, "--block-tokens")
    _positive(args.max_model_len, "--max-model-len")
    if args.length_scale and args.max_model_len is None:
        raise ServelabError("--length-scale: give --max-model-len, the length it fits to")
    for scale in args.length_scale:
        if not scale > 0:
            raise ServelabError(f"--length-scale {scale:g}: give a scale above 0 (0.25)")
    rows = read_rows(Path(args.file), args.format)
    inside, span = choose_window(rows, args.window, args.busiest)
    opts = StatsOptions(
        block_tokens=args.block_tokens,
        busiest_s=args.busiest if args.busiest is not None else 60.0,
        max_model_len=args.max_model_len,
        scales=tuple(args.length_scale),
    )
    print(f"trace: {args.file}")
    print(stats_text(summarize(inside, span, opts), args.max_model_len), end="")
    if args.png:
        out = Path(args.png)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(stats_png(inside, span, f"{Path(args.file).name}: {span.label}"))
        print(f"wrote {out}")
    return 0


def run_synth(args: argparse.Namespace) -> int:
    from servelab.workload.trace_stats import choose_window
    from servelab.workload.trace_summary import StatsOptions, read_rows, summarize
    from servelab.workload.trace_synth import (
        SynthPlan,
        jsonl_bytes,
        pin_text,
        side_by_side,
        synthesize,
        synthetic_stats,
    )

    _positive(args.block_tokens, "--block-tokens")
    plan = SynthPlan(args.rate, args.duration, args.seed, args.block_tokens)
    plan.requests()  # the rate and duration checked before the file is read
    rows = read_rows(Path(args.file), args.format)
    inside, span = choose_window(rows, args.window, args.busiest)
    synthetic = synthesize(inside, plan)
    data = jsonl_bytes(synthetic)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    source = summarize(inside, span, StatsOptions(block_tokens=args.block_tokens))
    print(f"source: {args.file}, {span.label}; synthetic: {len(synthetic):,} requests")
    print(side_by_side(source, synthetic_stats(synthetic, plan)), end="")
    print(f"wrote {out}")
    print(pin_text(args.out, data, plan), end="")
    return 0
