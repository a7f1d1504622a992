"""Per-point telemetry summaries (the flat analysis columns: servelab.telemetry.columns).

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
  two samples; and the host's mean busy (and steal) percent is over that same span, each
  sample's percent weighted by its interval, so that a point shorter than a sampling period
  has one too.
- an energy counter (a GPU's NVML total energy, the CPU packages' RAPL joules) is read at the
  window's two ends, each interpolated linearly between the samples around it, so the energy
  is the point's own however the samples fall; null unless samples bracket both ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypedDict

import numpy as np

from servelab.documents.declared import (
    CpuSummary,
    EnergySummary,
    GpuDevice,
    GpuSummary,
    HistogramStats,
    RaplSummary,
    SeriesStats,
    ServerSummary,
    TelemetryJson,
)

SUMMARY_FORMAT = 1
GpuField = Literal[
    "util_pct", "mem_util_pct", "sm_clock_mhz", "mem_used_bytes", "power_w", "temp_c"
]
GPU_FIELDS: tuple[GpuField, ...] = (
    "util_pct",
    "mem_util_pct",
    "sm_clock_mhz",
    "mem_used_bytes",
    "power_w",
    "temp_c",
)
CpuSeconds = Literal["server_cpu_s", "client_cpu_s", "telemetry_cpu_s", "siblings_cpu_s"]
CpuPercent = Literal["server_cpu_pct", "client_cpu_pct", "telemetry_cpu_pct", "siblings_cpu_pct"]
CpuGauge = Literal[
    "host_cpu_pct", "host_steal_pct", "server_rss_bytes", "client_rss_bytes", "host_mem_used_bytes"
]
CPU_CUMULATIVE: tuple[tuple[CpuSeconds, CpuPercent], ...] = (
    ("server_cpu_s", "server_cpu_pct"),
    ("client_cpu_s", "client_cpu_pct"),
    ("telemetry_cpu_s", "telemetry_cpu_pct"),
)
# the CPU of other servers kept up beside the point's (a point sent in slices): in the `cpu`
# block only where it was sampled
SIBLINGS: tuple[CpuSeconds, CpuPercent] = ("siblings_cpu_s", "siblings_cpu_pct")
CPU_GAUGES: tuple[CpuGauge, ...] = (
    "host_cpu_pct",
    "host_steal_pct",
    "server_rss_bytes",
    "client_rss_bytes",
    "host_mem_used_bytes",
)
# the host's shares of all cores, each sample's over the interval since the one before: their
# mean is over the same span as the processes' CPU seconds (`_host_mean`)
HOST_SHARES: tuple[CpuGauge, ...] = ("host_cpu_pct", "host_steal_pct")
ServerGauge = Literal["running", "waiting", "kv_cache_usage"]
ServerCounter = Literal[
    "preemptions",
    "generation_tokens",
    "prompt_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "requests_finished",
]
ServerHistogram = Literal["ttft", "itl", "queue_time"]
SERVER_GAUGES: tuple[ServerGauge, ...] = ("running", "waiting", "kv_cache_usage")
SERVER_COUNTERS: tuple[tuple[str, ServerCounter], ...] = (
    ("preemptions_total", "preemptions"),
    ("generation_tokens_total", "generation_tokens"),
    ("prompt_tokens_total", "prompt_tokens"),
    ("prefix_cache_queries_total", "prefix_cache_queries"),
    ("prefix_cache_hits_total", "prefix_cache_hits"),
    ("requests_finished_total", "requests_finished"),
)
SERVER_HISTOGRAMS: tuple[tuple[str, ServerHistogram], ...] = (
    ("ttft_s", "ttft"),
    ("itl_s", "itl"),
    ("queue_s", "queue_time"),
)

Sample = Mapping[str, Any]


class Errors(TypedDict):
    """A source's failed samples in the window: how many, and the last one's error."""

    errors: int
    last_error: str | None


def series_stats(values: Iterable[float | int | None]) -> SeriesStats:
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
    samples: Sequence[Sample], key: str, start_ns: int, end_ns: int, closing: bool = False
) -> tuple[Sample, Sample] | None:
    """The samples that bracket the window for `key`: the last at or before the start (else
    the first there is) and the first at or after the end (else the last there is); with
    `closing`, the last at or after the end: the closing sample, which for the server's
    counters is taken once they have settled (ServerMetricsSource.read_closing), where a
    periodic scrape just after the point can still miss its last step."""
    have = sorted((s for s in samples if s.get(key) is not None), key=lambda s: int(s["epoch_ns"]))
    if not have or end_ns < start_ns:
        return None
    before = [s for s in have if int(s["epoch_ns"]) <= start_ns]
    after = [s for s in have if int(s["epoch_ns"]) >= end_ns]
    first = before[-1] if before else have[0]
    last = (after[-1] if closing else after[0]) if after else have[-1]
    if int(last["epoch_ns"]) < int(first["epoch_ns"]):
        return None
    return first, last


def _delta(
    samples: Sequence[Sample], key: str, start_ns: int, end_ns: int, closing: bool = False
) -> float | None:
    b = bracket(samples, key, start_ns, end_ns, closing)
    return None if b is None else float(b[1][key]) - float(b[0][key])


def _span_s(
    samples: Sequence[Sample], key: str, start_ns: int, end_ns: int, closing: bool = False
) -> float | None:
    b = bracket(samples, key, start_ns, end_ns, closing)
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


def _histogram_delta(a: Mapping[str, Any], b: Mapping[str, Any]) -> HistogramStats:
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


def _errors(samples: Sequence[Sample]) -> Errors:
    errs = [s for s in samples if s.get("error")]
    return {"errors": len(errs), "last_error": str(errs[-1]["error"]) if errs else None}


def _selection(samples: Sequence[Sample]) -> dict[str, Any] | None:
    for s in samples:
        sel = s.get("selection")
        if isinstance(sel, Mapping):
            return dict(sel)
    return None


def _gpu(samples: Sequence[Sample], start: int, end: int) -> GpuSummary:
    selection = _selection(samples)
    recorded: GpuSummary = {"selection": selection} if selection else {}
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
    devices: list[GpuDevice] = []
    for index in sorted({int(s["device"]) for s in readings}):
        dev = [s for s in readings if s.get("device") == index]
        inside = in_window(dev, start, end)
        lost_at = next(
            (s["epoch_ns"] for s in dev if str(s.get("error", "")).startswith("device lost")),
            None,
        )
        energy_mj = counter_change(dev, "energy_mj", start, end)
        errs = _errors(inside)
        entry: GpuDevice = {
            "device": index,
            "name": dev[0].get("name"),
            "uuid": dev[0].get("uuid"),
            "samples": len(inside),
            "lost_epoch_ns": lost_at,
            "errors": errs["errors"],
            "last_error": errs["last_error"],
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
    out: GpuSummary = {"devices": devices}
    if selection is not None:
        out["selection"] = selection
    return out


def _rapl(samples: Sequence[Sample], start: int, end: int) -> RaplSummary | None:
    if not samples:
        return None
    reason = _absent(samples, "rapl")
    if reason is not None:
        return {"absent": reason}
    good = [s for s in samples if not s.get("error")]
    zones = sorted(
        {str(z) for s in good if isinstance(s.get("zones"), Mapping) for z in s["zones"]}
    )
    errs = _errors(in_window(samples, start, end))
    return {
        "zones": zones,
        "samples": len(in_window(samples, start, end)),
        "errors": errs["errors"],
        "last_error": errs["last_error"],
        "energy_j": counter_change(good, "energy_j", start, end),
    }


def _energy(
    gpu: GpuSummary, rapl: RaplSummary | None, output_tokens: int | None, span_s: float
) -> EnergySummary:
    """The server's energy over the point: its GPUs' (NVML) where GPUs were sampled, else,
    for a server on the CPU, the CPU packages' (RAPL); per output token where the point's
    output tokens are known."""
    out: EnergySummary = {
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
            out["joules"] = sum(float(d.get("energy_j") or 0.0) for d in devices)
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
        elif (energy_j := rapl.get("energy_j")) is None:
            out["absent"] = "no RAPL reading before and after the point"
        else:
            out["joules"] = float(energy_j)
    else:
        out["absent"] = f"the server's GPUs were not sampled: {gpu.get('absent')}"
    if out["joules"] is not None and output_tokens:
        out["joules_per_output_token"] = out["joules"] / output_tokens
    return out


def _cpu(samples: Sequence[Sample], start: int, end: int) -> CpuSummary:
    reason = _absent(samples, "cpu")
    if reason is not None:
        return {"absent": reason}
    inside = in_window(samples, start, end)
    out: CpuSummary = {"samples": len(inside)}
    siblings = any(s.get("siblings_cpu_s") is not None for s in samples)
    for cum_key, pct_key in CPU_CUMULATIVE + ((SIBLINGS,) if siblings else ()):
        used = _delta(samples, cum_key, start, end)
        span = _span_s(samples, cum_key, start, end)
        stats = series_stats(s.get(pct_key) for s in inside)
        stats["mean"] = 100.0 * used / span if used is not None and span else None
        out[pct_key] = stats
        out[cum_key] = used
    for key in CPU_GAUGES:
        out[key] = series_stats(s.get(key) for s in inside)
    for key in HOST_SHARES:  # gauges, each set just above
        share = out[key]
        if share is not None:
            share["mean"] = _host_mean(samples, key, start, end)
    cpus = [s["host_cpus"] for s in samples if s.get("host_cpus")]
    out["host_cpus"] = int(cpus[0]) if cpus else None
    errs = [s["server_error"] for s in samples if s.get("server_error")]
    out["server_error"] = str(errs[-1]) if errs else None
    return out


def _host_mean(samples: Sequence[Sample], key: str, start: int, end: int) -> float | None:
    """The host's busy (or steal) percent over the span the processes' CPU seconds are read
    across: from the last sample at or before the start to the first at or after the end.
    Each sample's percent is of the interval since the sample before it, so the mean weights
    each by its interval's length. It is there for a point shorter than a sampling period too
    (the closing sample covers it), where no sample falls inside the window; null where no
    sample after the opening one has a percent."""
    b = bracket(samples, "epoch_ns", start, end)
    if b is None:
        return None
    t0, t1 = int(b[0]["epoch_ns"]), int(b[1]["epoch_ns"])
    weighted = 0.0
    covered = 0
    prev: int | None = None
    for s in sorted(samples, key=lambda s: int(s["epoch_ns"])):
        t = int(s["epoch_ns"])
        value = s.get(key)
        if prev is not None and t0 < t <= t1 and value is not None:
            weighted += float(value) * (t - prev)
            covered += t - prev
        prev = t
    return weighted / covered if covered else None


def _server(samples: Sequence[Sample], start: int, end: int) -> ServerSummary:
    reason = _absent(samples, "server")
    if reason is not None:
        return {"absent": reason}
    good = [s for s in samples if not s.get("error")]
    inside = in_window(good, start, end)
    errs = _errors(in_window(samples, start, end))
    out: ServerSummary = {
        "samples": len(inside),
        "errors": errs["errors"],
        "last_error": errs["last_error"],
    }
    for gauge in SERVER_GAUGES:
        out[gauge] = series_stats(s.get(gauge) for s in inside)
    waiting = [float(s["waiting"]) for s in inside if s.get("waiting") is not None]
    out["waiting_fraction"] = sum(1 for w in waiting if w > 0) / len(waiting) if waiting else None
    # the server's counters and histograms up to the closing scrape, taken once they settled
    for raw_key, counter in SERVER_COUNTERS:
        out[counter] = _delta(good, raw_key, start, end, closing=True)
    # over the nearest samples: the settled closing scrape can come up to a second later
    span = _span_s(good, "generation_tokens_total", start, end)
    gen = out["generation_tokens"]
    out["generation_tokens_per_s"] = gen / span if gen is not None and span else None
    for raw_key, histogram in SERVER_HISTOGRAMS:
        b = bracket(good, raw_key, start, end, closing=True)
        out[histogram] = (
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
) -> TelemetryJson:
    """The `telemetry` block of point.json: every source summarized over the point window.
    `output_tokens` (the point's `total_output_tokens`) gives the energy per output token.

    `rapl` and `energy` are there for samples that record the GPUs' selection or RAPL (this
    servelab's); a summary of older samples has the blocks it had."""
    by_source: dict[str, list[Sample]] = {"gpu": [], "cpu": [], "server": [], "rapl": []}
    for s in samples:
        by_source.setdefault(str(s.get("source")), []).append(s)
    start, end = int(started_epoch_ns), int(finished_epoch_ns)
    gpu = _gpu(by_source["gpu"], start, end)
    out: TelemetryJson = {
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
