"""Flat analysis columns of a point's telemetry summary (servelab.telemetry.summary.summarize)
and the utilization-vs-throughput rows: what the analysis tables (points.csv, summary.csv) and
the utilization figure read of the telemetry."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

COLUMNS = (
    "utilization_pct",
    "gpu_absent",
    "gpu_devices",
    "gpu_util_pct_mean",
    "gpu_util_pct_p95",
    "gpu_util_pct_max",
    "gpu_sm_clock_mhz_mean",
    "gpu_mem_used_bytes_max",
    "gpu_power_w_mean",
    "gpu_power_w_max",
    "gpu_temp_c_max",
    "cpu_server_util_pct_mean",
    "cpu_server_util_pct_p95",
    "cpu_server_util_pct_max",
    "cpu_client_util_pct_mean",
    "cpu_client_util_pct_p95",
    "cpu_client_util_pct_max",
    "cpu_host_util_pct_mean",
    "cpu_host_util_pct_p95",
    "cpu_host_util_pct_max",
    "cpu_telemetry_util_pct_mean",
    "cpu_host_cpus",
    "server_rss_bytes_max",
    "client_rss_bytes_max",
    "host_mem_used_bytes_max",
    "running_mean",
    "running_p95",
    "running_max",
    "waiting_mean",
    "waiting_p95",
    "waiting_max",
    "waiting_fraction",
    "kv_usage_mean",
    "kv_usage_p95",
    "kv_usage_max",
    "preemptions",
    "server_generation_tokens",
    "server_generation_tokens_per_s",
    "server_prompt_tokens",
    "server_ttft_mean_ms",
    "server_ttft_p95_ms",
    "server_itl_mean_ms",
    "server_itl_p95_ms",
    "server_queue_time_mean_ms",
    "server_queue_time_p95_ms",
    "server_metrics_absent",
    "server_scrape_errors",
    "telemetry_samples_gpu",
    "telemetry_samples_cpu",
    "telemetry_samples_server",
    "server_prefix_cache_queries",
    "server_prefix_cache_hits",
    "server_requests_finished",
)
# the GPUs sampled and how they were chosen, and the server's energy over the point: in a
# table where a point recorded them (the summaries of older points keep the table they had)
ENERGY_COLUMNS = (
    "gpu_selection",
    "gpu_selection_ambiguous",
    "gpu_indices",
    "gpu_uuids",
    "gpu_util_pct_mean_by_device",
    "gpu_power_w_mean_by_device",
    "energy_source",
    "energy_j",
    "joules_per_output_token",
    "energy_absent",
)


# a telemetry column's value: a number, a word (why a source is absent, the GPUs' UUIDs), a
# flag, or null where unknown
Cell = str | int | float | bool | None


class UtilizationRow(TypedDict):
    """One point of the utilization-vs-throughput table and figure."""

    server_config: str | None
    concurrency: int | float | None
    repeat: int | None
    output_throughput: float | None
    utilization_source: str
    utilization_pct: float | None
    gpu_util_pct: Cell
    server_cpu_pct: Cell
    host_cpus: Cell
    fraction_of_best_throughput: NotRequired[float | None]


def table_columns(summaries: Iterable[Mapping[str, Any] | None]) -> tuple[str, ...]:
    """The telemetry columns of a table of points with these telemetry blocks: none without
    one, COLUMNS, and ENERGY_COLUMNS after them where a block has an `energy` summary."""
    blocks = list(summaries)
    if not blocks:
        return ()
    if any(isinstance(b, Mapping) and isinstance(b.get("energy"), Mapping) for b in blocks):
        return (*COLUMNS, *ENERGY_COLUMNS)
    return COLUMNS


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = d
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def _by_device(devices: Sequence[Mapping[str, Any]], field: str) -> str | None:
    vals = [_get(d, field, "mean") for d in devices]
    if not devices or all(v is None for v in vals):
        return None
    return ";".join("" if v is None else f"{float(v):.1f}" for v in vals)


def _over_devices(
    devices: Sequence[Mapping[str, Any]], field: str, stat: str, how: str
) -> float | None:
    """One statistic of every GPU combined: their mean (`how` "mean") or the largest."""
    vals = [_get(d, field, stat) for d in devices]
    have = [float(v) for v in vals if v is not None]
    if not have:
        return None
    return statistics.fmean(have) if how == "mean" else max(have)


def _gpu_columns(summary: Mapping[str, Any]) -> dict[str, Cell]:
    """The GPUs' columns: utilization, clock, memory, power and temperature over devices,
    their selection, and each device's index, UUID, utilization and power."""
    gpu = summary.get("gpu") or {}
    devices = gpu.get("devices") or []
    out: dict[str, Cell] = {"gpu_absent": gpu.get("absent")}
    out["gpu_devices"] = len(devices) if devices else None
    out["gpu_util_pct_mean"] = _over_devices(devices, "util_pct", "mean", "mean")
    out["gpu_util_pct_p95"] = _over_devices(devices, "util_pct", "p95", "max")
    out["gpu_util_pct_max"] = _over_devices(devices, "util_pct", "max", "max")
    out["gpu_sm_clock_mhz_mean"] = _over_devices(devices, "sm_clock_mhz", "mean", "mean")
    out["gpu_mem_used_bytes_max"] = _over_devices(devices, "mem_used_bytes", "max", "max")
    out["gpu_power_w_mean"] = _over_devices(devices, "power_w", "mean", "mean")
    out["gpu_power_w_max"] = _over_devices(devices, "power_w", "max", "max")
    out["gpu_temp_c_max"] = _over_devices(devices, "temp_c", "max", "max")
    out["telemetry_samples_gpu"] = sum(int(d.get("samples", 0)) for d in devices) or (
        0 if devices else None
    )
    sel = gpu.get("selection")
    if isinstance(sel, Mapping):
        out["gpu_selection"] = sel.get("origin")
        out["gpu_selection_ambiguous"] = sel.get("ambiguous")
    if devices:
        out["gpu_indices"] = ";".join(str(d.get("device")) for d in devices)
        out["gpu_uuids"] = ";".join(str(d.get("uuid") or "") for d in devices)
    out["gpu_util_pct_mean_by_device"] = _by_device(devices, "util_pct")
    out["gpu_power_w_mean_by_device"] = _by_device(devices, "power_w")
    return out


def _energy_columns(summary: Mapping[str, Any]) -> dict[str, Cell]:
    """The server's energy over the point, where the summary has an `energy` block."""
    energy = summary.get("energy")
    if not isinstance(energy, Mapping):
        return {}
    return {
        "energy_source": energy.get("source"),
        "energy_j": energy.get("joules"),
        "joules_per_output_token": energy.get("joules_per_output_token"),
        "energy_absent": energy.get("absent"),
    }


def _cpu_columns(summary: Mapping[str, Any]) -> dict[str, Cell]:
    """The CPU's columns: server, client and host CPU percent, memory, samples."""
    cpu = summary.get("cpu") or {}
    out: dict[str, Cell] = {}
    for who in ("server", "client", "host"):
        for stat in ("mean", "p95", "max"):
            out[f"cpu_{who}_util_pct_{stat}"] = _get(cpu, f"{who}_cpu_pct", stat)
    out["cpu_telemetry_util_pct_mean"] = _get(cpu, "telemetry_cpu_pct", "mean")
    out["cpu_host_cpus"] = cpu.get("host_cpus")
    for key in ("server_rss_bytes", "client_rss_bytes", "host_mem_used_bytes"):
        out[f"{key}_max"] = _get(cpu, key, "max")
    out["telemetry_samples_cpu"] = cpu.get("samples")
    return out


def _server_columns(summary: Mapping[str, Any]) -> dict[str, Cell]:
    """The server's own /metrics: its queue, KV usage, tokens, latencies, scrapes."""
    srv = summary.get("server") or {}
    out: dict[str, Cell] = {"server_metrics_absent": srv.get("absent")}
    for name, key in (
        ("running", "running"),
        ("waiting", "waiting"),
        ("kv_usage", "kv_cache_usage"),
    ):
        for stat in ("mean", "p95", "max"):
            out[f"{name}_{stat}"] = _get(srv, key, stat)
    out["waiting_fraction"] = srv.get("waiting_fraction")
    out["preemptions"] = srv.get("preemptions")
    out["server_generation_tokens"] = srv.get("generation_tokens")
    out["server_generation_tokens_per_s"] = srv.get("generation_tokens_per_s")
    out["server_prompt_tokens"] = srv.get("prompt_tokens")
    out["server_prefix_cache_queries"] = srv.get("prefix_cache_queries")
    out["server_prefix_cache_hits"] = srv.get("prefix_cache_hits")
    out["server_requests_finished"] = srv.get("requests_finished")
    for name in ("ttft", "itl", "queue_time"):
        out[f"server_{name}_mean_ms"] = _get(srv, name, "mean_ms")
        out[f"server_{name}_p95_ms"] = _get(srv, name, "p95_ms")
    out["server_scrape_errors"] = srv.get("errors")
    out["telemetry_samples_server"] = srv.get("samples")
    return out


# the builders of telemetry_columns, each the columns of one block of the summary
COLUMN_BUILDERS: tuple[Callable[[Mapping[str, Any]], dict[str, Cell]], ...] = (
    _gpu_columns,
    _energy_columns,
    _cpu_columns,
    _server_columns,
)


def telemetry_columns(summary: Mapping[str, Any] | None) -> dict[str, Cell]:
    """One point's telemetry as flat columns (always the keys of COLUMNS and ENERGY_COLUMNS;
    null when unknown), from each of COLUMN_BUILDERS.

    The GPUs are the server's (those sampled). Several GPUs: utilization and power means are
    averaged over devices, maxima are the largest device's; `gpu_indices`, `gpu_uuids` and the
    `*_by_device` columns list each GPU, `;`-separated, in NVML index order. KV usage is a
    fraction (0-1); CPU percent is of one core. `utilization_pct` is 0-100 for either kind of
    device: the GPU's mean where GPUs were sampled, else the server's CPU as a share of all the
    host's cores.
    """
    out: dict[str, Cell] = dict.fromkeys((*COLUMNS, *ENERGY_COLUMNS))
    if not summary or summary.get("enabled") is False:
        out["gpu_absent"] = "telemetry disabled" if summary else "no telemetry recorded"
        out["server_metrics_absent"] = out["energy_absent"] = out["gpu_absent"]
        return out
    for build in COLUMN_BUILDERS:
        out.update(build(summary))
    cpu_pct, cores = out["cpu_server_util_pct_mean"], out["cpu_host_cpus"]
    out["utilization_pct"] = (
        out["gpu_util_pct_mean"]
        if out["gpu_util_pct_mean"] is not None
        else (float(cpu_pct) / int(cores) if cpu_pct is not None and cores else None)
    )
    return out


def utilization_pct(summary: Mapping[str, Any] | None) -> float | None:
    """One point's utilization on a 0-100 scale for either kind of device: the GPU's (mean over
    devices) where GPUs were sampled, else the server process tree's CPU as a share of all the
    host's cores. Null without telemetry."""
    value = telemetry_columns(summary)["utilization_pct"]
    return None if value is None else float(value)


def utilization_vs_throughput(points: Iterable[Mapping[str, Any]]) -> list[UtilizationRow]:
    """Per point: utilization next to output throughput and its share of the best point's.

    `utilization_pct` is `utilization_pct(point["telemetry"])`, 0-100 for either kind of device
    (`server_cpu_pct` keeps the CPU in % of one core, as top shows it). A device that
    looks busy while delivering a small fraction of the best throughput is what this table
    (and its figure) is for.
    """
    rows: list[UtilizationRow] = []
    for p in points:
        cols = telemetry_columns(p.get("telemetry"))
        gpu = cols["gpu_util_pct_mean"]
        rows.append(
            {
                "server_config": p.get("server_config"),
                "concurrency": p.get("concurrency"),
                "repeat": p.get("repeat"),
                "output_throughput": p.get("output_throughput"),
                "utilization_source": "gpu" if gpu is not None else "cpu",
                "utilization_pct": utilization_pct(p.get("telemetry")),
                "gpu_util_pct": gpu,
                "server_cpu_pct": cols["cpu_server_util_pct_mean"],
                "host_cpus": cols["cpu_host_cpus"],
            }
        )
    tputs = [float(r["output_throughput"]) for r in rows if r["output_throughput"] is not None]
    best = max(tputs) if tputs else None
    for r in rows:
        t = r["output_throughput"]
        r["fraction_of_best_throughput"] = t / best if t is not None and best else None
    rows.sort(key=lambda r: (str(r["server_config"]), r["concurrency"] or 0, r["repeat"] or 0))
    return rows
