"""Per-point telemetry summaries, flat analysis columns and the utilization-vs-throughput rows.

Pure functions of the samples of `telemetry.jsonl` and the point window
[started_epoch_ns, finished_epoch_ns] (both ends included):

- a gauge-like series (GPU fields, memory, running / waiting / KV usage, CPU percent over each
  sampling interval) is summarized by mean, p95 (linear interpolation) and max of the samples
  inside the window; samples outside it are left out;
- a counter (server tokens, prefix-cache tokens, finished requests, preemptions, CPU
  seconds) is the difference between the last sample at or before the start and the first
  sample at or after the end (the samplers take one sample just before and one just after
  every point), so nothing that happened during the point is missed however short it is.
  The mean CPU percent is such a difference too: CPU seconds over the span between those
  two samples.
- an energy counter (a GPU's NVML total energy, the CPU packages' RAPL joules) is read at the
  window's two ends, each interpolated linearly between the samples around it, so the energy
  is the point's own however the samples fall; null unless samples bracket both ends.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

SUMMARY_FORMAT = 1
GPU_FIELDS = ("util_pct", "mem_util_pct", "sm_clock_mhz", "mem_used_bytes", "power_w", "temp_c")
CPU_CUMULATIVE = (
    ("server_cpu_s", "server_cpu_pct"),
    ("client_cpu_s", "client_cpu_pct"),
    ("telemetry_cpu_s", "telemetry_cpu_pct"),
)
CPU_GAUGES = (
    "host_cpu_pct",
    "host_steal_pct",
    "server_rss_bytes",
    "client_rss_bytes",
    "host_mem_used_bytes",
)
SERVER_GAUGES = ("running", "waiting", "kv_cache_usage")
SERVER_COUNTERS = (
    ("preemptions_total", "preemptions"),
    ("generation_tokens_total", "generation_tokens"),
    ("prompt_tokens_total", "prompt_tokens"),
    ("prefix_cache_queries_total", "prefix_cache_queries"),
    ("prefix_cache_hits_total", "prefix_cache_hits"),
    ("requests_finished_total", "requests_finished"),
)
SERVER_HISTOGRAMS = (("ttft_s", "ttft"), ("itl_s", "itl"), ("queue_s", "queue_time"))

Sample = Mapping[str, Any]


def series_stats(values: Iterable[float | int | None]) -> dict[str, float | None]:
    arr = np.asarray([float(v) for v in values if v is not None], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "p95": None, "max": None}
    return {
        "mean": float(arr.mean()),
        "p95": float(np.percentile(arr, 95)),
        "max": float(arr.max()),
    }


def in_window(samples: Iterable[Sample], start_ns: int, end_ns: int) -> list[Sample]:
    return [s for s in samples if start_ns <= int(s["epoch_ns"]) <= end_ns]


def bracket(
    samples: Sequence[Sample], key: str, start_ns: int, end_ns: int
) -> tuple[Sample, Sample] | None:
    """The samples that bracket the window for `key`: the last at or before the start (else
    the first there is) and the first at or after the end (else the last there is)."""
    have = sorted((s for s in samples if s.get(key) is not None), key=lambda s: int(s["epoch_ns"]))
    if not have or end_ns < start_ns:
        return None
    before = [s for s in have if int(s["epoch_ns"]) <= start_ns]
    after = [s for s in have if int(s["epoch_ns"]) >= end_ns]
    first = before[-1] if before else have[0]
    last = after[0] if after else have[-1]
    if int(last["epoch_ns"]) < int(first["epoch_ns"]):
        return None
    return first, last


def _delta(samples: Sequence[Sample], key: str, start_ns: int, end_ns: int) -> float | None:
    b = bracket(samples, key, start_ns, end_ns)
    return None if b is None else float(b[1][key]) - float(b[0][key])


def _span_s(samples: Sequence[Sample], key: str, start_ns: int, end_ns: int) -> float | None:
    b = bracket(samples, key, start_ns, end_ns)
    return None if b is None else (int(b[1]["epoch_ns"]) - int(b[0]["epoch_ns"])) / 1e9


def _counter_points(samples: Sequence[Sample], key: str) -> list[tuple[int, float]]:
    return sorted((int(s["epoch_ns"]), float(s[key])) for s in samples if s.get(key) is not None)


def _interpolate(have: Sequence[tuple[int, float]], t_ns: int) -> float | None:
    for (t0, v0), (t1, v1) in zip(have, have[1:], strict=False):
        if t0 <= t_ns <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)
    if len(have) == 1 and have[0][0] == t_ns:
        return have[0][1]
    return None


def counter_at(samples: Sequence[Sample], key: str, t_ns: int) -> float | None:
    """A counter's value at `t_ns`, interpolated linearly between the samples around it; null
    outside the samples' span."""
    return _interpolate(_counter_points(samples, key), t_ns)


def counter_change(samples: Sequence[Sample], key: str, start_ns: int, end_ns: int) -> float | None:
    """A counter's change over [start, end] (`counter_at` at both ends); null where a sample
    does not bracket an end or the counter went back in between (a reset)."""
    have = _counter_points(samples, key)
    a, b = _interpolate(have, start_ns), _interpolate(have, end_ns)
    if a is None or b is None or end_ns < start_ns:
        return None
    span = [v for i, (_, v) in enumerate(have) if _around(have, i, start_ns, end_ns)]
    if any(later < earlier for earlier, later in zip(span, span[1:], strict=False)):
        return None
    return b - a


def _around(have: Sequence[tuple[int, float]], i: int, start_ns: int, end_ns: int) -> bool:
    """Sample i is inside [start, end] or the last before it or the first after it."""
    t = have[i][0]
    if start_ns <= t <= end_ns:
        return True
    nxt = have[i + 1][0] if i + 1 < len(have) else None
    prev = have[i - 1][0] if i > 0 else None
    return (t < start_ns and nxt is not None and nxt >= start_ns) or (
        t > end_ns and prev is not None and prev <= end_ns
    )


def histogram_quantile(q: float, buckets: Sequence[Sequence[float]], count: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative [finite upper bound, count] buckets and
    the total count: linear within a bucket; past the last finite bound, that bound."""
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if cum == below:
                return float(le)
            return lower + (float(le) - lower) * (rank - below) / (float(cum) - below)
        lower, below = float(le), float(cum)
    return lower if buckets else None


def _histogram_delta(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float | None]:
    count = float(b["count"]) - float(a["count"])
    total = float(b["sum"]) - float(a["sum"])
    first = {float(le): float(n) for le, n in a["buckets"]}
    diff = [
        [float(le), float(n) - first[float(le)]] for le, n in b["buckets"] if float(le) in first
    ]
    p95 = histogram_quantile(0.95, diff, count)
    return {
        "count": count,
        "mean_ms": 1000.0 * total / count if count > 0 else None,
        "p95_ms": 1000.0 * p95 if p95 is not None and count > 0 else None,
    }


def _absent(samples: Sequence[Sample], source: str) -> str | None:
    for s in samples:
        if s.get("source") == source and "absent" in s:
            return str(s["absent"])
    return None


def _errors(samples: Sequence[Sample]) -> dict[str, Any]:
    errs = [s for s in samples if s.get("error")]
    return {"errors": len(errs), "last_error": str(errs[-1]["error"]) if errs else None}


def _selection(samples: Sequence[Sample]) -> dict[str, Any] | None:
    for s in samples:
        sel = s.get("selection")
        if isinstance(sel, Mapping):
            return dict(sel)
    return None


def _gpu(samples: Sequence[Sample], start: int, end: int) -> dict[str, Any]:
    selection = _selection(samples)
    recorded = {"selection": selection} if selection else {}
    reason = _absent(samples, "gpu")
    if reason is not None:
        return {"absent": reason, **recorded}
    readings = [s for s in samples if "device" in s]
    if not readings:
        return {"absent": "no GPU sample was taken", **recorded}
    chosen = {
        int(g["device"]): g
        for g in (selection or {}).get("gpus") or []
        if isinstance(g, Mapping) and isinstance(g.get("device"), int)
    }
    devices: list[dict[str, Any]] = []
    for index in sorted({int(s["device"]) for s in readings}):
        dev = [s for s in readings if s.get("device") == index]
        inside = in_window(dev, start, end)
        lost_at = next(
            (s["epoch_ns"] for s in dev if str(s.get("error", "")).startswith("device lost")),
            None,
        )
        energy_mj = counter_change(dev, "energy_mj", start, end)
        entry: dict[str, Any] = {
            "device": index,
            "name": dev[0].get("name"),
            "uuid": dev[0].get("uuid"),
            "samples": len(inside),
            "lost_epoch_ns": lost_at,
            **_errors(inside),
        }
        for f in GPU_FIELDS:
            entry[f] = series_stats(s.get(f) for s in inside)
        if selection is not None:
            info = chosen.get(index, {})
            entry["pci_bus_id"] = info.get("pci_bus_id")
            entry["chosen_by"] = info.get("chosen_by")
            entry["energy_j"] = None if energy_mj is None else energy_mj / 1000.0
            entry["energy_counter"] = info.get("energy_counter")
        devices.append(entry)
    out: dict[str, Any] = {"devices": devices}
    if selection is not None:
        out["selection"] = selection
    return out


def _rapl(samples: Sequence[Sample], start: int, end: int) -> dict[str, Any] | None:
    if not samples:
        return None
    reason = _absent(samples, "rapl")
    if reason is not None:
        return {"absent": reason}
    good = [s for s in samples if not s.get("error")]
    zones = sorted(
        {str(z) for s in good if isinstance(s.get("zones"), Mapping) for z in s["zones"]}
    )
    return {
        "zones": zones,
        "samples": len(in_window(samples, start, end)),
        **_errors(in_window(samples, start, end)),
        "energy_j": counter_change(good, "energy_j", start, end),
    }


def _energy(
    gpu: Mapping[str, Any], rapl: Mapping[str, Any] | None, output_tokens: int | None, span_s: float
) -> dict[str, Any]:
    """The server's energy over the point: its GPUs' (NVML) where GPUs were sampled, else,
    for a server on the CPU, the CPU packages' (RAPL); per output token where the point's
    output tokens are known."""
    out: dict[str, Any] = {
        "source": None,
        "joules": None,
        "window_s": span_s,
        "output_tokens": output_tokens,
        "joules_per_output_token": None,
        "absent": None,
    }
    devices = gpu.get("devices") or []
    how = (gpu.get("selection") or {}).get("how")
    if devices:
        out["source"] = "nvml"
        missing = [d for d in devices if d.get("energy_j") is None]
        if not missing:
            out["joules"] = sum(float(d["energy_j"]) for d in devices)
        else:
            d = missing[0]
            why = d.get("energy_counter") or "no reading before and after the point"
            out["absent"] = f"GPU {d.get('device')} ({d.get('name')}) energy counter: {why}"
    elif how in (None, "none"):  # a server on the CPU
        out["source"] = "rapl"
        if rapl is None:
            out["absent"] = "the CPU packages' energy was not sampled"
        elif rapl.get("absent"):
            out["absent"] = str(rapl["absent"])
        elif rapl.get("energy_j") is None:
            out["absent"] = "no RAPL reading before and after the point"
        else:
            out["joules"] = float(rapl["energy_j"])
    else:
        out["absent"] = f"the server's GPUs were not sampled: {gpu.get('absent')}"
    if out["joules"] is not None and output_tokens:
        out["joules_per_output_token"] = out["joules"] / output_tokens
    return out


def _cpu(samples: Sequence[Sample], start: int, end: int) -> dict[str, Any]:
    reason = _absent(samples, "cpu")
    if reason is not None:
        return {"absent": reason}
    inside = in_window(samples, start, end)
    out: dict[str, Any] = {"samples": len(inside)}
    for cum_key, pct_key in CPU_CUMULATIVE:
        used = _delta(samples, cum_key, start, end)
        span = _span_s(samples, cum_key, start, end)
        stats = series_stats(s.get(pct_key) for s in inside)
        stats["mean"] = 100.0 * used / span if used is not None and span else None
        out[pct_key] = stats
        out[cum_key] = used
    for key in CPU_GAUGES:
        out[key] = series_stats(s.get(key) for s in inside)
    cpus = [s["host_cpus"] for s in samples if s.get("host_cpus")]
    out["host_cpus"] = int(cpus[0]) if cpus else None
    errs = [s["server_error"] for s in samples if s.get("server_error")]
    out["server_error"] = str(errs[-1]) if errs else None
    return out


def _server(samples: Sequence[Sample], start: int, end: int) -> dict[str, Any]:
    reason = _absent(samples, "server")
    if reason is not None:
        return {"absent": reason}
    good = [s for s in samples if not s.get("error")]
    inside = in_window(good, start, end)
    out: dict[str, Any] = {"samples": len(inside), **_errors(in_window(samples, start, end))}
    for key in SERVER_GAUGES:
        out[key] = series_stats(s.get(key) for s in inside)
    waiting = [float(s["waiting"]) for s in inside if s.get("waiting") is not None]
    out["waiting_fraction"] = sum(1 for w in waiting if w > 0) / len(waiting) if waiting else None
    for raw_key, key in SERVER_COUNTERS:
        out[key] = _delta(good, raw_key, start, end)
    span = _span_s(good, "generation_tokens_total", start, end)
    gen = out["generation_tokens"]
    out["generation_tokens_per_s"] = gen / span if gen is not None and span else None
    for raw_key, key in SERVER_HISTOGRAMS:
        b = bracket(good, raw_key, start, end)
        out[key] = (
            _histogram_delta(b[0][raw_key], b[1][raw_key])
            if b is not None
            else {"count": None, "mean_ms": None, "p95_ms": None}
        )
    return out


def summarize(
    samples: Sequence[Sample],
    started_epoch_ns: int,
    finished_epoch_ns: int,
    output_tokens: int | None = None,
) -> dict[str, Any]:
    """The `telemetry` block of point.json: every source summarized over the point window.
    `output_tokens` (the point's `total_output_tokens`) gives the energy per output token.

    `rapl` and `energy` are there for samples that record the GPUs' selection or RAPL (this
    servelab's); a summary of older samples has the blocks it had."""
    by_source: dict[str, list[Sample]] = {"gpu": [], "cpu": [], "server": [], "rapl": []}
    for s in samples:
        by_source.setdefault(str(s.get("source")), []).append(s)
    start, end = int(started_epoch_ns), int(finished_epoch_ns)
    gpu = _gpu(by_source["gpu"], start, end)
    out: dict[str, Any] = {
        "format_version": SUMMARY_FORMAT,
        "gpu": gpu,
        "cpu": _cpu(by_source["cpu"], start, end),
        "server": _server(by_source["server"], start, end),
    }
    rapl = _rapl(by_source["rapl"], start, end)
    if rapl is not None or "selection" in gpu:
        out["rapl"] = rapl
        out["energy"] = _energy(gpu, rapl, output_tokens, max(0, end - start) / 1e9)
    return out


# --- flat columns for the analysis tables ---------------------------------------------------

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


def _gpu_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The GPUs' columns: utilization, clock, memory, power and temperature over devices,
    their selection, and each device's index, UUID, utilization and power."""
    gpu = summary.get("gpu") or {}
    devices = gpu.get("devices") or []
    out: dict[str, Any] = {"gpu_absent": gpu.get("absent")}
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


def _energy_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
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


def _cpu_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The CPU's columns: server, client and host CPU percent, memory, samples."""
    cpu = summary.get("cpu") or {}
    out: dict[str, Any] = {}
    for who in ("server", "client", "host"):
        for stat in ("mean", "p95", "max"):
            out[f"cpu_{who}_util_pct_{stat}"] = _get(cpu, f"{who}_cpu_pct", stat)
    out["cpu_telemetry_util_pct_mean"] = _get(cpu, "telemetry_cpu_pct", "mean")
    out["cpu_host_cpus"] = cpu.get("host_cpus")
    for key in ("server_rss_bytes", "client_rss_bytes", "host_mem_used_bytes"):
        out[f"{key}_max"] = _get(cpu, key, "max")
    out["telemetry_samples_cpu"] = cpu.get("samples")
    return out


def _server_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The server's own /metrics: its queue, KV usage, tokens, latencies, scrapes."""
    srv = summary.get("server") or {}
    out: dict[str, Any] = {"server_metrics_absent": srv.get("absent")}
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
COLUMN_BUILDERS: tuple[Callable[[Mapping[str, Any]], dict[str, Any]], ...] = (
    _gpu_columns,
    _energy_columns,
    _cpu_columns,
    _server_columns,
)


def telemetry_columns(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """One point's telemetry as flat columns (always the keys of COLUMNS and ENERGY_COLUMNS;
    null when unknown), from each of COLUMN_BUILDERS.

    The GPUs are the server's (those sampled). Several GPUs: utilization and power means are
    averaged over devices, maxima are the largest device's; `gpu_indices`, `gpu_uuids` and the
    `*_by_device` columns list each GPU, `;`-separated, in NVML index order. KV usage is a
    fraction (0-1); CPU percent is of one core. `utilization_pct` is 0-100 for either kind of
    device: the GPU's mean where GPUs were sampled, else the server's CPU as a share of all the
    host's cores.
    """
    out: dict[str, Any] = dict.fromkeys((*COLUMNS, *ENERGY_COLUMNS))
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


def utilization_vs_throughput(points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per point: utilization next to output throughput and its share of the best point's.

    `utilization_pct` is `utilization_pct(point["telemetry"])`, 0-100 for either kind of device
    (`server_cpu_pct` keeps the CPU in % of one core, as top shows it). A device that
    looks busy while delivering a small fraction of the best throughput is what this table
    (and its figure) is for.
    """
    rows: list[dict[str, Any]] = []
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
