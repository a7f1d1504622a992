"""Telemetry on every point: GPU (NVML), CPU and memory (psutil) and the server's /metrics,
sampled in the background while a point runs, and summarized over the point's window.

The raw samples are `raw/<config>/rep<RR>/c<CCCC>/telemetry.jsonl`; the summary is the
`telemetry` block of the point's point.json (docs/raw-data.md).
"""

from servelab.telemetry.figure import plot_utilization_vs_throughput
from servelab.telemetry.sampling import (
    FILE_NAME,
    PointTelemetry,
    read_samples,
    write_samples,
)
from servelab.telemetry.sources import parse_metrics
from servelab.telemetry.summary import (
    COLUMNS,
    summarize,
    telemetry_columns,
    utilization_pct,
    utilization_vs_throughput,
)

__all__ = [
    "COLUMNS",
    "FILE_NAME",
    "PointTelemetry",
    "parse_metrics",
    "plot_utilization_vs_throughput",
    "read_samples",
    "summarize",
    "telemetry_columns",
    "utilization_pct",
    "utilization_vs_throughput",
    "write_samples",
]
