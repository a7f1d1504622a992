"""`servelab profile analyze`: where the time goes, from a trace and its windows.

The trace analysis is `servelab.profile.trace_analysis.analyze_trace`; profile.json, the CSV
tables and profile.md are written by `servelab.profile.report.write_profile`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.errors import ServelabError

if TYPE_CHECKING:
    from servelab.documents.declared import ProfileRecord
    from servelab.profile.trace_analysis import TraceOptions


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `servelab profile analyze` on the top-level subparsers."""
    p = sub.add_parser("profile", help="profile traces: analyze an nsys or torch-profiler trace")
    psub = p.add_subparsers(dest="profile_command", required=True)
    a = psub.add_parser(
        "analyze",
        help="active fraction, kernel families, attention paths, forwards, steady state",
        description="Analyze an nsys SQLite export (or torch-profiler trace JSON files) over "
        "the windows of windows.json; write profile.json, CSV tables and profile.md.",
    )
    a.add_argument("trace", nargs="+", help="nsys .sqlite export, or torch trace .json[.gz]")
    a.add_argument("--windows", required=True, help="windows.json written by the profile pass")
    layers = a.add_mutually_exclusive_group()
    layers.add_argument("--layers", type=int, help="transformer layers of the model")
    layers.add_argument("--model-config", help="the model's config.json (num_hidden_layers)")
    a.add_argument("--out", required=True, help="output folder")
    a.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="kernel family, in match order (repeat; replaces the defaults; 'other' is implicit)",
    )
    a.add_argument(
        "--attention-kernel",
        help="regex of the main attention kernel (default: "
        "the attention-family kernel with the most time)",
    )
    a.add_argument(
        "--population-dim",
        choices=["x", "y", "z"],
        help="grid dimension that counts sequences (default: found from the trace)",
    )
    a.add_argument(
        "--path-dims",
        metavar="DIMS",
        help="grid dimensions that name an attention path, e.g. x or x,z; none: one path "
        "(default: those that do not scale with the forward's population)",
    )
    a.add_argument(
        "--band",
        type=float,
        default=None,
        help="steady state: relative population band (default 0.10)",
    )
    a.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    from servelab.profile.report import write_profile
    from servelab.profile.trace_analysis import analyze_trace
    from servelab.profile.windows import load_windows

    opts = _trace_options(args)
    windows = load_windows(Path(args.windows))
    result = analyze_trace([Path(t) for t in args.trace], windows, opts)
    out = Path(args.out)
    write_profile(out, result.profile, result)
    _print_profile(result.profile)
    print(f"{out}: profile.json, {len(result.profile['windows'])} windows")
    return 0


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    """The analysis settings the options give (the defaults where none is given)."""
    from servelab.profile.codepaths import parse_path_dims
    from servelab.profile.forwards import layers_from_config
    from servelab.profile.kernels import parse_family_args as parse_families
    from servelab.profile.trace_analysis import TraceOptions

    opts = TraceOptions()
    if args.layers is not None:
        if args.layers < 1:
            raise ServelabError(f"--layers {args.layers}: must be at least 1")
        opts.layers, opts.layers_source = args.layers, "--layers"
    elif args.model_config:
        path = Path(args.model_config)
        opts.layers, opts.layers_source = layers_from_config(path), path.name
    if args.family:
        opts.families = parse_families(args.family)
    opts.attention_kernel = args.attention_kernel
    opts.population_dim = args.population_dim
    if args.path_dims is not None:
        opts.path_dims = parse_path_dims(args.path_dims, "--path-dims")
        opts.path_dims_source = "--path-dims"
    if args.band is not None:
        if not 0 <= args.band < 10:
            raise ServelabError(f"--band {args.band}: give a relative band such as 0.1")
        opts.band = args.band
    return opts


def _print_profile(profile: ProfileRecord) -> None:
    """Per window its active fraction and steady state, then the verdicts and notes."""
    for label, w in profile["windows"].items():
        s = w["steady"]
        af = ", ".join(f"{d} {v:.2f}" for d, v in w["active_fraction"].items()) or "-"
        steady = (
            f"steady {s['first']}-{s['last']} population {s['population_mean']:.3g}, "
            f"{s['kernel_us_mean']:.3g} µs/launch"
            if s
            else "no steady state"
        )
        print(f"{label}: active {af}; {steady}")
        for p in (s.get("paths") if s else None) or []:
            print(
                f"  path {p['path']}: steady {p['forwards']} forwards, population "
                f"{p['population_mean']:.4g}, {p['kernel_us_mean']:.4g} µs/launch"
            )
    for v in profile["localisation"]:
        print(v["text"])
    for n in profile["notes"]:
        print(f"note: {n}")
