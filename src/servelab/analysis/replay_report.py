"""report.md's "Trace replay": for a trace workload (workload.trace), per server configuration
and rate, the time scale the trace was replayed at, how late its sends were against the
recorded schedule (the send_slip check's 90th percentile) and how much of the reuse the trace
implies the server's prefix cache served (the trace_reuse check's share), over the repeats;
no section (no lines) for any other workload."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import cast

from servelab.analysis.groups import Groups
from servelab.analysis.validity import Flag
from servelab.analysis.validity.facts import number
from servelab.analysis.validity.flags import block
from servelab.documents.declared import WindowJson
from servelab.render import md_table
from servelab.workload.trace import window_text


def _span(values: Sequence[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    lo, hi = min(known), max(known)
    return format(lo, fmt) if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"


def _value(flags: Sequence[Flag], check: str) -> float | None:
    return next((f.value for f in flags if f.check == check), None)


def replay_section(g: Groups) -> list[str]:
    rows: list[list[object]] = []
    for (sc, c), reps in sorted(g.by.items()):
        points = [p for _, p in sorted(reps.items()) if isinstance(p.extra.get("trace"), dict)]
        if not points:
            continue
        trace = points[0].extra["trace"]
        slips = [_value(p.checks, "send_slip") for p in points]
        reuse = [_value(p.checks, "trace_reuse") for p in points]
        window = block(trace, "window")
        rows.append(
            [
                sc,
                f"{float(c):g}",
                f"{number(trace['time_scale']):.3g}",
                f"{window.get('requests')} of {window.get('in_window')}",
                _span(slips, ".1f"),
                block(trace, "reuse").get("reused_tokens"),
                _span(reuse, ".2f"),
            ]
        )
    if not rows:
        return []
    header = [
        "Server config",
        "Rate (req/s)",
        "Time scale",
        "Requests replayed",
        "p90 send slip (ms)",
        "Reuse implied (tokens)",
        "Reuse served",
    ]
    return [
        "## Trace replay",
        "",
        "Each request sent at its recorded time x the time scale (the window's recorded rate "
        "over the point's rate), latencies from that scheduled send. Send slip: how late the "
        "sends were (the send_slip check); reuse served: the prompt tokens the server's prefix "
        "cache served as a share of the reuse the trace implies (the trace_reuse check; - where "
        "the configuration does not enable caching). Over the repeats: the lowest-highest.",
        "",
        *md_table(header, rows, align="llrrrrr"),
        "",
        *fidelity_tables(g),
    ]


def _pair(t: Mapping[str, object], a: str, b: str) -> str:
    return f"{t.get(a, '-')} / {t.get(b, '-')}"


def _reuse(t: Mapping[str, object], block_tokens: object) -> str:
    ratio = t.get("reuse_ratio")
    said = "-" if ratio is None else f"{number(ratio):.3f}"
    return f"{said} ({block_tokens}-token blocks)"


def fidelity_tables(g: Groups) -> list[str]:
    """The window as the trace recorded it against the traffic replayed, one table per distinct
    window record (the configurations that replayed it named): requests, rate, length p50 and
    p90, implied reuse; its caption says how the requests were fitted and what was left out."""
    seen: dict[str, tuple[Mapping[str, object], list[str]]] = {}
    for (sc, _), reps in sorted(g.by.items()):
        for _, p in sorted(reps.items()):
            trace = p.extra.get("trace")
            window = block(trace, "window") if isinstance(trace, Mapping) else {}
            if "original" not in window:
                continue
            key = json.dumps(window, sort_keys=True)
            configs = seen.setdefault(key, (window, []))[1]
            if sc not in configs:
                configs.append(sc)
    out: list[str] = []
    for window, configs in seen.values():
        orig, done, fit = block(window, "original"), block(window, "replayed"), block(window, "fit")
        share = number(window.get("kept_share", 0))
        rows: list[list[object]] = [
            ["Requests", orig.get("requests"), f"{done.get('requests')} ({100 * share:.1f}%)"],
            ["Rate (req/s, as recorded)", f"{number(orig.get('rate', 0)):.3g}",
             f"{number(done.get('rate', 0)):.3g}"],
            ["Input p50 / p90 (tokens)", _pair(orig, "input_p50", "input_p90"),
             _pair(done, "input_p50", "input_p90")],
            ["Output p50 / p90 (tokens)", _pair(orig, "output_p50", "output_p90"),
             _pair(done, "output_p50", "output_p90")],
            ["Implied reuse", _reuse(orig, _trace_block(fit)),
             _reuse(done, fit.get("block_tokens"))],
        ]  # fmt: skip
        said = window_text(cast(WindowJson, window))
        out += [
            f"### The window replayed ({', '.join(configs)})",
            "",
            f"The trace's window as recorded against the requests replayed ({said}; "
            f"the replay had to keep at least {number(fit.get('min_kept', 0)):g} of them: "
            "workload.trace.min_kept). Lengths are nearest-rank quantiles; the implied reuse is "
            "the share of prompt tokens an earlier request of the window sent at the same place.",
            "",
            *md_table(["", "Original window", "Replayed"], rows, align="lrr"),
            "",
        ]
    return out


def _trace_block(fit: Mapping[str, object]) -> object:
    """The trace's own block size: the replayed block over length_scale."""
    scale, replayed = fit.get("length_scale"), fit.get("block_tokens")
    if isinstance(scale, int | float) and isinstance(replayed, int) and scale > 0:
        return round(replayed / scale)
    return "-"
