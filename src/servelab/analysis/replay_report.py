"""report.md's "Trace replay": for a trace workload (workload.trace), per server configuration
and rate, the time scale the trace was replayed at, how late its sends were against the
recorded schedule (the send_slip check's 90th percentile) and how much of the reuse the trace
implies the server's prefix cache served (the trace_reuse check's share), over the repeats;
no section (no lines) for any other workload."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.analysis.groups import Groups
from servelab.analysis.validity import Flag
from servelab.analysis.validity.facts import number
from servelab.analysis.validity.flags import block
from servelab.render import md_table


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
    ]
