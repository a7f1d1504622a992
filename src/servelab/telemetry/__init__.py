"""Telemetry on every point: the server's GPUs (NVML), CPU and memory (psutil), the CPU
packages' energy (RAPL) and the server's /metrics, sampled in the background while a point
runs, and summarized over the point's window, with the server's energy per output token.

The raw samples are `raw/<config>/rep<RR>/c<CCCC>/telemetry.jsonl`; the summary is the
`telemetry` block of the point's point.json (docs/raw-data.md).
"""

from servelab.telemetry.columns import (
    COLUMNS,
    ENERGY_COLUMNS,
    table_columns,
    telemetry_columns,
    utilization_pct,
    utilization_vs_throughput,
)
from servelab.telemetry.figure import plot_utilization_vs_throughput
from servelab.telemetry.gpus import GpuSelection, server_gpus
from servelab.telemetry.sampling import (
    FILE_NAME,
    PointTelemetry,
    read_samples,
    write_samples,
)
from servelab.telemetry.sources import parse_metrics
from servelab.telemetry.summary import summarize

__all__ = [
    "COLUMNS",
    "ENERGY_COLUMNS",
    "FILE_NAME",
    "GpuSelection",
    "PointTelemetry",
    "parse_metrics",
    "plot_utilization_vs_throughput",
    "read_samples",
    "server_gpus",
    "summarize",
    "table_columns",
    "telemetry_columns",
    "utilization_pct",
    "utilization_vs_throughput",
    "write_samples",
]
