"""The one-screen summary printed at the end of a run (`servelab summary`, summary.txt):
`screen`, the means per point, the validity line and where the time went on this host;
`rounds`, a sequential sweep's rounds; `values`, what both read from the records."""

from servelab.summary.screen import (
    canary_lines,
    on_sweep_captures,
    render_summary,
    summary_rows,
    wall_line,
)

__all__ = ["canary_lines", "on_sweep_captures", "render_summary", "summary_rows", "wall_line"]
