"""Flat analysis columns of a point's telemetry summary (servelab.telemetry.summary.summarize)
and the utilization-vs-throughput rows: what the analysis tables (points.csv, summary.csv) and
the utilization figure read of the telemetry."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NotRequired, TypedDict

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


def table_columns(summaries: Iterable[object]) -> tuple[str, ...]:
    """The telemetry columns of a table of points with these telemetry blocks (as read: one
    that is not an object counts as none): none without one, COLUMNS, and ENERGY_COLUMNS after
    them where a block has an `energy` summary."""
    blocks = list(summaries)
    if not blocks:
        return ()
    if any(isinstance(b, Mapping) and isinstance(b.get("energy"), Mapping) for b in blocks):
        return (*COLUMNS, *ENERGY_COLUMNS)
    return COLUMNS


def _get(d: object, *path: str) -> Cell:
    """The value at `path` in a block; None where the block does not have it, or has there a
    value no column holds (a list or an object: never in a summary `summarize` writes)."""
    cur = d
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur if cur is None or isinstance(cur, str | int | float) else None


def _block(summary: Mapping[str, object], key: str) -> Mapping[str, object]:
    """One block of the summary ({} where it has none)."""
    block = summary.get(key) or {}
    if not isinstance(block, Mapping):
        raise TypeError(f"telemetry {key}: not an object")
    return block


def _by_device(devices: Sequence[Mapping[str, object]], field: str) -> str | None:
    vals = [_get(d, field, "mean") for d in devices]
    if not devices or all(v is None for v in vals):
        return None
    return ";".join("" if v is None else f"{float(v):.1f}" for v in vals)


def _over_devices(
    devices: Sequence[Mapping[str, object]], field: str, stat: str, how: str
) -> float | None:
    """One statistic of every GPU combined: their mean (`how` "mean") or the largest."""
    vals = [_get(d, field, stat) for d in devices]
    have = [float(v) for v in vals if v is not None]
    if not have:
        return None
    return statistics.fmean(have) if how == "mean" else max(have)


def _gpu_columns(summary: Mapping[str, object]) -> dict[str, Cell]:
    """The GPUs' columns: utilization, clock, memory, power and temperature over devices,
    their selection, and each device's index, UUID, utilization and power."""
    gpu = _block(summary, "gpu")
    listed = gpu.get("devices") or []
    if not isinstance(listed, list) or not all(isinstance(d, Mapping) for d in listed):
        raise TypeError("telemetry gpu.devices: not a list of objects")
    devices: list[Mapping[str, object]] = listed
    out: dict[str, Cell] = {"gpu_absent": _get(gpu, "absent")}
    out["gpu_devices"] = len(devices) if devices else None
    out["gpu_util_pct_mean"] = _over_devices(devices, "util_pct", "mean", "mean")
    out["gpu_util_pct_p95"] = _over_devices(devices, "util_pct", "p95", "max")
    out["gpu_util_pct_max"] = _over_devices(devices, "util_pct", "max", "max")
    out["gpu_sm_clock_mhz_mean"] = _over_devices(devices, "sm_clock_mhz", "mean", "mean")
    out["gpu_mem_used_bytes_max"] = _over_devices(devices, "mem_used_bytes", "max", "max")
    out["gpu_power_w_mean"] = _over_devices(devices, "power_w", "mean", "mean")
    out["gpu_power_w_max"] = _over_devices(devices, "power_w", "max", "max")
    out["gpu_temp_c_max"] = _over_devices(devices, "temp_c", "max", "max")
    out["telemetry_samples_gpu"] = sum(int(_get(d, "samples") or 0) for d in devices) or (
        0 if devices else None
    )
    sel = gpu.get("selection")
    if isinstance(sel, Mapping):
        out["gpu_selection"] = _get(sel, "origin")
        out["gpu_selection_ambiguous"] = _get(sel, "ambiguous")
    if devices:
        out["gpu_indices"] = ";".join(str(d.get("device")) for d in devices)
        out["gpu_uuids"] = ";".join(str(d.get("uuid") or "") for d in devices)
    out["gpu_util_pct_mean_by_device"] = _by_device(devices, "util_pct")
    out["gpu_power_w_mean_by_device"] = _by_device(devices, "power_w")
    return out


def _energy_columns(summary: Mapping[str, object]) -> dict[str, Cell]:
    """The server's energy over the point, where the summary has an `energy` block."""
    energy = summary.get("energy")
    if not isinstance(energy, Mapping):
        return {}
    return {
        "energy_source": _get(energy, "source"),
        "energy_j": _get(energy, "joules"),
        "joules_per_output_token": _get(energy, "joules_per_output_token"),
        "energy_absent": _get(energy, "absent"),
    }


def _cpu_columns(summary: Mapping[str, object]) -> dict[str, Cell]:
    """The CPU's columns: server, client and host CPU percent, memory, samples."""
    cpu = _block(summary, "cpu")
    out: dict[str, Cell] = {}
    for who in ("server", "client", "host"):
        for stat in ("mean", "p95", "max"):
            out[f"cpu_{who}_util_pct_{stat}"] = _get(cpu, f"{who}_cpu_pct", stat)
    out["cpu_telemetry_util_pct_mean"] = _get(cpu, "telemetry_cpu_pct", "mean")
    out["cpu_host_cpus"] = _get(cpu, "host_cpus")
    for key in ("server_rss_bytes", "client_rss_bytes", "host_mem_used_bytes"):
        out[f"{key}_max"] = _get(cpu, key, "max")
    out["telemetry_samples_cpu"] = _get(cpu, "samples")
    return out


def _server_columns(summary: Mapping[str, object]) -> dict[str, Cell]:
    """The server's own /metrics: its queue, KV usage, tokens, latencies, scrapes."""
    srv = _block(summary, "server")
    out: dict[str, Cell] = {"server_metrics_absent": _get(srv, "absent")}
    for name, key in (
        ("running", "running"),
        ("waiting", "waiting"),
        ("kv_usage", "kv_cache_usage"),
    ):
        for stat in ("mean", "p95", "max"):
            out[f"{name}_{stat}"] = _get(srv, key, stat)
    for column, key in (
        ("waiting_fraction", "waiting_fraction"),
        ("preemptions", "preemptions"),
        ("server_generation_tokens", "generation_tokens"),
        ("server_generation_tokens_per_s", "generation_tokens_per_s"),
        ("server_prompt_tokens", "prompt_tokens"),
        ("server_prefix_cache_queries", "prefix_cache_queries"),
        ("server_prefix_cache_hits", "prefix_cache_hits"),
        ("server_requests_finished", "requests_finished"),
    ):
        out[column] = _get(srv, key)
    for name in ("ttft", "itl", "queue_time"):
        out[f"server_{name}_mean_ms"] = _get(srv, name, "mean_ms")
        out[f"server_{name}_p95_ms"] = _get(srv, name, "p95_ms")
    out["server_scrape_errors"] = _get(srv, "errors")
    out["telemetry_samples_server"] = _get(srv, "samples")
    return out


# the builders of telemetry_columns, each the columns of one block of the summary
COLUMN_BUILDERS: tuple[Callable[[Mapping[str, object]], dict[str, Cell]], ...] = (
    _gpu_columns,
    _energy_columns,
    _cpu_columns,
    _server_columns,
)


def telemetry_columns(summary: Mapping[str, object] | None) -> dict[str, Cell]:
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


def utilization_pct(summary: Mapping[str, object] | None) -> float | None:
    """One point's utilization on a 0-100 scale for either kind of device: the GPU's (mean over
    devices) where GPUs were sampled, else the server process tree's CPU as a share of all the
    host's cores. Null without telemetry."""
    value = telemetry_columns(summary)["utilization_pct"]
    return None if value is None else float(value)


def utilization_vs_throughput(points: Iterable[Mapping[str, object]]) -> list[UtilizationRow]:
    """Per point: utilization next to output throughput and its share of the best point's.

    `utilization_pct` is `utilization_pct(point["telemetry"])`, 0-100 for either kind of device
    (`server_cpu_pct` keeps the CPU in % of one core, as top shows it). A device that
    looks busy while delivering a small fraction of the best throughput is what this table
    (and its figure) is for.
    """
    rows: list[UtilizationRow] = []
    for p in points:
        telemetry = p.get("telemetry")
        summary = telemetry if isinstance(telemetry, Mapping) else None
        cols = telemetry_columns(summary)
        gpu = cols["gpu_util_pct_mean"]
        sc, level, repeat, tput = (
            p.get(k) for k in ("server_config", "concurrency", "repeat", "output_throughput")
        )
        rows.append(
            {
                "server_config": None if sc is None else str(sc),
                "concurrency": level if isinstance(level, int | float) else None,
                "repeat": repeat if isinstance(repeat, int) else None,
                "output_throughput": tput if isinstance(tput, int | float) else None,
                "utilization_source": "gpu" if gpu is not None else "cpu",
                "utilization_pct": utilization_pct(summary),
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
