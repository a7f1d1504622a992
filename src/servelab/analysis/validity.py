"""Validity checks run on every measured point (docs/analysis.md#validity).

A check is a pure function of what was recorded for one point (its requests, its duration,
its telemetry summary) and the thresholds of the config's `analysis.validity` section. It
returns a Flag: passed, failed, noted (recorded, never excluding) or not checked (the data it
needs was not recorded). A failed check removes the metrics it affects from every statistic:
`latency` (TTFT, TPOT and ITL metrics: burst delivery leaves E2EL and throughput intact),
`ttft` or `itl` alone, or `all`. The raw data stays as it was. docs/pitfalls.md maps each
check to the measurement mistake it catches.

To add a check: write a function (PointFacts, ValiditySection) -> Flag, add the facts it reads
to PointFacts (and to both builders), its threshold to the schema (analysis.validity) and to
servelab.experiment.ValiditySection, and an entry to CHECKS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from servelab.client import RequestRecord
from servelab.experiment import ValiditySection

FORMAT_VERSION = 1
PASSED, FAILED, NOTED, NOT_CHECKED = "passed", "failed", "noted", "not checked"
STATUSES = (PASSED, FAILED, NOTED, NOT_CHECKED)
LATENCY, TTFT, ITL, ALL, NONE = "latency", "ttft", "itl", "all", "none"
AFFECTS_WORDS = {
    LATENCY: "TTFT, TPOT, ITL",
    TTFT: "TTFT",
    ITL: "ITL",
    ALL: "every metric",
    NONE: "nothing (note)",
}
AFFECTED_METRIC = {
    LATENCY: re.compile(r"_(ttft|tpot|itl)_ms$"),
    TTFT: re.compile(r"_ttft_ms$"),
    ITL: re.compile(r"_itl_ms$"),
}
SECTION = "analysis.validity"

# streaming: a request is burst-delivered when its content came in at most this many reads
# while it has at least BURST_MIN_TOKENS output tokens (fewer tokens fit in two reads anyway)
BURST_MAX_READS = 2
BURST_MIN_TOKENS = 4
# vllm-bench trees keep one timestamp per chunk, not per read: chunks of one read are
# microseconds apart, so gaps under this count as the same read
BENCH_SAME_READ_S = 1e-4
ERROR_CHARS = 80


def thresholds_json(t: ValiditySection) -> dict[str, Any]:
    """The thresholds as validity.json records them: numbers, counts as integers."""
    return {
        f.name: int(v) if f.name == "max_failed_requests" else float(v)
        for f in fields(t)
        for v in [getattr(t, f.name)]
    }


@dataclass(frozen=True)
class RequestFacts:
    completed: bool  # succeeded and carried content
    output_tokens: int | None
    reads: int | None  # reads that carried content; None when unknown
    error: str | None
    prompt_tokens: int | None = None
    chunks: int | None = None  # content chunks; None when unknown
    # tokens each content chunk carried (the server's per-chunk usage); None when not recorded
    chunk_tokens: tuple[int, ...] | None = None
    # content chunks without text, by index; None when not recorded
    empty_chunks: tuple[int, ...] | None = None
    queued_us: int | None = None  # waited in the client for its slot
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache
    e2el_us: int | None = None  # send to end of stream


@dataclass(frozen=True)
class PointFacts:
    """What the checks read of one point, from either raw layout."""

    requests: tuple[RequestFacts, ...]
    duration_s: float | None  # first send to last completion; None when nothing completed
    telemetry: Mapping[str, Any] | None  # point.json's `telemetry` block
    no_telemetry: str = "no telemetry recorded"
    # what the point asked for (point.json); None when not recorded
    concurrency: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    ignore_eos: bool | None = None
    # the server configuration's arguments (launch.json `args`); None when not recorded
    server_args: Mapping[str, Any] | None = None
    # time-weighted requests in flight, first send to last send (servelab.metrics)
    achieved_concurrency: float | None = None
    # client CPU seconds over the point's window, when the telemetry block lacks it
    client_cpu_s: float | None = None
    window_s: float | None = None
    # the warm-up of the same server launch ended after the point's first send (ns); None when
    # it ended before, or nothing says
    warmup_overlap_ns: int | None = None


@dataclass(frozen=True)
class Flag:
    check: str
    status: str
    value: float | None
    threshold: float | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    definition: str
    affects: str  # LATENCY | TTFT | ITL | ALL | NONE
    threshold_key: str | None  # key under analysis.validity
    run: Callable[[PointFacts, ValiditySection], Flag]

    def removes(self, metric: str) -> bool:
        if self.affects == ALL:
            return True
        pattern = AFFECTED_METRIC.get(self.affects)
        return pattern is not None and pattern.search(metric) is not None

    def threshold(self, t: ValiditySection) -> float | None:
        return None if self.threshold_key is None else float(getattr(t, self.threshold_key))


# --- facts from the raw layouts -------------------------------------------------------------


def _int_or_none(v: Any) -> int | None:
    return None if v is None or isinstance(v, bool) else int(v)


def facts_from_records(
    records: Sequence[RequestRecord],
    meta: Mapping[str, Any],
    server_args: Mapping[str, Any] | None = None,
    warmup: Mapping[str, Any] | None = None,
) -> PointFacts:
    """servelab's layout: requests.jsonl.gz, point.json, the configuration's launch.json `args`
    and the warm-up's point.json (same server launch)."""
    from servelab.metrics import in_flight

    reqs = []
    for r in records:
        done = bool(r.ok and r.chunk_offsets_us)
        error = r.error if not done else None
        if not done and not error:
            error = "no content received" if r.ok else "failed without an error message"
        reqs.append(
            RequestFacts(
                completed=done,
                output_tokens=r.output_tokens,
                reads=len(set(r.chunk_offsets_us)) if done else None,
                error=error,
                prompt_tokens=r.prompt_tokens,
                chunks=len(r.chunk_offsets_us),
                chunk_tokens=tuple(r.chunk_tokens) if r.chunk_tokens is not None else None,
                empty_chunks=tuple(r.empty_chunks) if r.empty_chunks is not None else None,
                queued_us=r.queued_us,
                cached_tokens=r.cached_tokens,
                e2el_us=r.done_offset_us if done else None,
            )
        )
    good = [r for r in records if r.ok and r.chunk_offsets_us]
    duration = None
    if good:
        start = min(r.sent_epoch_ns for r in records)
        end = max(r.sent_epoch_ns + (r.done_offset_us or 0) * 1000 for r in good)
        duration = (end - start) / 1e9
    telemetry = meta.get("telemetry")
    t0, t1 = meta.get("started_epoch_ns"), meta.get("finished_epoch_ns")
    window = (int(t1) - int(t0)) / 1e9 if t0 and t1 and int(t1) > int(t0) else None
    overlap = None
    if warmup is not None and records and warmup.get("launch") == meta.get("launch"):
        first_send = min(r.sent_epoch_ns for r in records)
        wend = warmup.get("finished_epoch_ns")
        if wend is not None and int(wend) > first_send:
            overlap = int(wend) - first_send
    ignore_eos = meta.get("ignore_eos")
    return PointFacts(
        tuple(reqs),
        duration,
        telemetry if isinstance(telemetry, Mapping) else None,
        concurrency=_int_or_none(meta.get("concurrency")),
        input_tokens=_int_or_none(meta.get("input_tokens")),
        output_tokens=_int_or_none(meta.get("output_tokens")),
        ignore_eos=ignore_eos if isinstance(ignore_eos, bool) else None,
        server_args=server_args,
        achieved_concurrency=in_flight(records)[0],
        client_cpu_s=meta.get("client_cpu_s"),
        window_s=window,
        warmup_overlap_ns=overlap,
    )


def facts_from_bench(bench: Mapping[str, Any]) -> PointFacts:
    """A `vllm bench serve --save-detailed` benchmark.json: per-request ITLs stand in for reads
    (gaps under BENCH_SAME_READ_S join one read) and chunks; no telemetry."""
    n = len(bench["ttfts"])
    errors = bench.get("errors") or [""] * n
    itls = bench.get("itls") or [None] * n
    input_lens = bench.get("input_lens") or [None] * n
    reqs = []
    for i in range(n):
        out = bench["output_lens"][i]
        done = not errors[i] and out not in (0, None)
        gaps = itls[i] if i < len(itls) else None
        reads = 1 + sum(1 for g in gaps if float(g) >= BENCH_SAME_READ_S) if gaps else None
        reqs.append(
            RequestFacts(
                completed=done,
                output_tokens=int(out) if out is not None else None,
                reads=reads if done and gaps is not None else None,
                error=None if done else (str(errors[i]) or "no output"),
                prompt_tokens=_int_or_none(input_lens[i] if i < len(input_lens) else None),
                chunks=len(gaps) + 1 if done and gaps is not None else None,
            )
        )
    duration = float(bench["duration"]) if any(r.completed for r in reqs) else None
    return PointFacts(
        tuple(reqs),
        duration,
        None,
        no_telemetry="not recorded by vllm bench",
        concurrency=_int_or_none(bench.get("max_concurrency")),
    )


# --- the checks -----------------------------------------------------------------------------


def _g(x: float) -> str:
    return f"{x:g}"


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def check_streaming(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_burst_share)
    eligible = [r for r in f.requests if r.completed and (r.output_tokens or 0) >= BURST_MIN_TOKENS]
    known = [r for r in eligible if r.reads is not None]
    if not known:
        why = (
            "chunk arrival times not recorded"
            if eligible
            else f"no completed request with at least {BURST_MIN_TOKENS} output tokens"
        )
        return Flag("streaming", NOT_CHECKED, None, limit, why)
    burst = [r for r in known if (r.reads or 0) <= BURST_MAX_READS]
    how = "in one read" if all(r.reads == 1 for r in burst) and burst else "in one or two reads"
    share = len(burst) / len(known)
    said = f"{len(burst)} of {len(known)} requests delivered {how}"
    if share > limit:
        return Flag("streaming", FAILED, share, limit, f"{said} (limit {_g(100 * limit)}%)")
    return Flag("streaming", PASSED, share, limit, said)


def _block(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = d.get(key)
    return v if isinstance(v, Mapping) else {}


def _mean(d: Mapping[str, Any], key: str) -> float | None:
    v = _block(d, key).get("mean")
    return None if v is None else float(v)


def check_contention(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_other_cpu_cores)
    tel = f.telemetry
    if tel is None:
        return Flag("contention", NOT_CHECKED, None, limit, f.no_telemetry)
    if tel.get("enabled") is False:
        return Flag("contention", NOT_CHECKED, None, limit, "telemetry disabled")
    cpu = _block(tel, "cpu")
    if cpu.get("absent"):
        return Flag("contention", NOT_CHECKED, None, limit, f"no CPU telemetry: {cpu['absent']}")
    host, cores = _mean(cpu, "host_cpu_pct"), cpu.get("host_cpus")
    if host is None or not cores:
        return Flag("contention", NOT_CHECKED, None, limit, "no host CPU sample inside the point")
    own = [_mean(cpu, k) for k in ("server_cpu_pct", "client_cpu_pct", "telemetry_cpu_pct")]
    if any(v is None for v in own):
        err = cpu.get("server_error")
        why = f"server CPU unknown ({err})" if own[0] is None and err else "process CPU unknown"
        return Flag("contention", NOT_CHECKED, None, limit, why)
    # percent of all cores and percents of one core, as cores; sampling can put the difference
    # slightly below zero on an idle host
    other = max(0.0, host / 100.0 * int(cores) - sum(v or 0.0 for v in own) / 100.0)
    said = f"{other:.2f} CPU cores busy outside the server, client and samplers"
    if other > limit:
        return Flag("contention", FAILED, other, limit, f"{said} (limit {_g(limit)})")
    return Flag("contention", PASSED, other, limit, said)


def check_failed_requests(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_failed_requests)
    n = len(f.requests)
    if n == 0:
        return Flag("failed_requests", NOT_CHECKED, None, limit, "no request recorded")
    bad = [r for r in f.requests if not r.completed]
    said = f"{len(bad)} of {n} requests failed"
    if len(bad) > limit:
        err = (bad[0].error or "")[:ERROR_CHARS]
        return Flag(
            "failed_requests",
            FAILED,
            float(len(bad)),
            limit,
            f"{said} (limit {t.max_failed_requests}; first: {err})",
        )
    return Flag("failed_requests", PASSED, float(len(bad)), limit, said)


def check_restarted_requests(f: PointFacts, t: ValiditySection) -> Flag:
    tel = f.telemetry
    if tel is None:
        return Flag("restarted_requests", NOT_CHECKED, None, None, f.no_telemetry)
    srv = _block(tel, "server")
    n = srv.get("preemptions")
    if tel.get("enabled") is False or n is None:
        why = "telemetry disabled" if tel.get("enabled") is False else "no preemption counter"
        if srv.get("absent"):
            why = f"no server metrics: {srv['absent']}"
        return Flag("restarted_requests", NOT_CHECKED, None, None, why)
    if float(n) > 0:
        said = f"the server preempted requests {_g(float(n))} times (kept: server behaviour)"
        return Flag("restarted_requests", NOTED, float(n), None, said)
    return Flag("restarted_requests", PASSED, 0.0, None, "no preemption")


def check_min_duration(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.min_point_duration_s)
    if f.duration_s is None:
        return Flag("min_duration", NOT_CHECKED, None, limit, "no request completed")
    said = f"the point lasted {f.duration_s:.2f} s"
    if f.duration_s < limit:
        return Flag("min_duration", FAILED, f.duration_s, limit, f"{said} (minimum {_g(limit)} s)")
    return Flag("min_duration", PASSED, f.duration_s, limit, said)


# --- the pitfalls of serving benchmarks (docs/pitfalls.md) ----------------------------------


def _arg(args: Mapping[str, Any] | None, *names: str) -> Any:
    if not args:
        return None
    for name in names:
        for key in (name, name.replace("-", "_")):
            if key in args:
                return args[key]
    return None


def tokens_per_chunk_allowed(args: Mapping[str, Any] | None) -> int:
    """Tokens one streamed chunk may carry under the server's configuration: one per decode
    step, 1 + k with speculative decoding of k tokens (`num_speculative_tokens`)."""
    spec = _arg(args, "speculative-config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            spec = None
    k = spec.get("num_speculative_tokens") if isinstance(spec, Mapping) else None
    if k is None:
        k = _arg(args, "num-speculative-tokens")
    try:
        return 1 + max(0, int(k)) if k is not None else 1
    except (TypeError, ValueError):
        return 1


def check_chunk_tokens(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_merged_chunk_share)
    allowed = tokens_per_chunk_allowed(f.server_args)
    done = [r for r in f.requests if r.completed and r.chunks and r.output_tokens is not None]
    if not done:
        return Flag("chunk_tokens", NOT_CHECKED, None, limit, "no completed request")
    chunks = merged = 0
    estimated = mismatch = 0
    for r in done:
        n = int(r.chunks or 0)
        chunks += n
        if r.chunk_tokens is not None and len(r.chunk_tokens) == n:
            merged += sum(1 for k in r.chunk_tokens if k > allowed)
            mismatch += sum(r.chunk_tokens) != r.output_tokens
        else:  # from the totals: the most chunks the surplus tokens could occupy
            estimated += 1
            merged += min(n, max(0, int(r.output_tokens or 0) - n * allowed))
    share = merged / chunks
    per = "1 token" if allowed == 1 else f"up to {allowed} tokens"
    said = f"{merged} of {chunks} chunks carried more than {per}"
    if estimated:
        said += f" ({estimated} requests without per-chunk counts: judged from usage totals)"
    if mismatch:
        said += f"; {mismatch} requests' chunk counts do not add up to their usage"
    if share > limit or mismatch:
        return Flag("chunk_tokens", FAILED, share, limit, f"{said} (limit {_pct(limit)})")
    return Flag("chunk_tokens", PASSED, share, limit, said)


def check_first_token(f: PointFacts, t: ValiditySection) -> Flag:
    from servelab.metrics import first_output_chunk

    done = [r for r in f.requests if r.completed and r.chunks]
    if not done:
        return Flag("first_token", NOT_CHECKED, None, None, "no completed request")
    known = [r for r in done if r.empty_chunks is not None]
    if not known:
        return Flag("first_token", NOT_CHECKED, None, None, "chunks without text not recorded")
    first = [first_output_chunk(int(r.chunks or 0), r.empty_chunks, r.chunk_tokens) for r in known]
    none = sum(1 for i in first if i is None)
    late = sum(1 for i in first if i)
    if none:
        said = (
            f"{none} of {len(known)} requests carried neither text nor a per-chunk token count "
            "(TTFT undefined)"
        )
        return Flag("first_token", FAILED, float(none), None, said)
    if late:
        said = (
            f"{late} of {len(known)} requests' first chunk carried no output (no text, no "
            "token): their TTFT is the first chunk that did"
        )
        return Flag("first_token", NOTED, float(late), None, said)
    return Flag("first_token", PASSED, 0.0, None, "every first chunk carried output")


def _caching_asked(args: Mapping[str, Any] | None) -> bool:
    v = _arg(args, "enable-prefix-caching")
    return v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes"))


def check_prefix_cache(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_prefix_cache_hit_rate)
    srv = _block(f.telemetry or {}, "server")
    queries, hits = srv.get("prefix_cache_queries"), srv.get("prefix_cache_hits")
    source = "server counters"
    if queries is None or hits is None:
        cached = [r for r in f.requests if r.cached_tokens is not None]
        if not cached:
            why = f.no_telemetry if f.telemetry is None else "no prefix-cache counters"
            if srv.get("absent"):
                why = f"no server metrics: {srv['absent']}"
            return Flag("prefix_cache", NOT_CHECKED, None, limit, why)
        hits = sum(int(r.cached_tokens or 0) for r in cached)
        queries = sum(int(r.prompt_tokens or 0) for r in cached)
        source = "per-request cached tokens"
    if not queries:
        return Flag("prefix_cache", PASSED, 0.0, limit, "no prompt tokens looked up")
    rate = float(hits) / float(queries)
    said = f"{_g(float(hits))} of {_g(float(queries))} prompt tokens came from the prefix cache"
    if _caching_asked(f.server_args):
        return Flag(
            "prefix_cache", NOTED, rate, limit, f"{said} (caching enabled by the configuration)"
        )
    if rate > limit:
        return Flag(
            "prefix_cache",
            FAILED,
            rate,
            limit,
            f"{said} ({source}; the configuration did not ask for caching; limit {_pct(limit)})",
        )
    return Flag("prefix_cache", PASSED, rate, limit, said)


def _drift(name: str, limit: float, wanted: int, got: list[int], what: str) -> Flag:
    worst = max(abs(g - wanted) for g in got) / wanted
    off = [g for g in got if abs(g - wanted) / wanted * 100 > limit]
    lo, hi = min(got), max(got)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    said = f"{what} of {span} tokens for {wanted} requested"
    if off:
        return Flag(
            name,
            FAILED,
            100 * worst,
            limit,
            f"{len(off)} of {len(got)} requests: {said} (limit {_g(limit)}%)",
        )
    return Flag(name, PASSED, 100 * worst, limit, said)


def check_prompt_length(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_prompt_drift_pct)
    if not f.input_tokens:
        return Flag("prompt_length", NOT_CHECKED, None, limit, "requested length not recorded")
    got = [int(r.prompt_tokens) for r in f.requests if r.completed and r.prompt_tokens is not None]
    if not got:
        return Flag("prompt_length", NOT_CHECKED, None, limit, "no usage.prompt_tokens recorded")
    return _drift("prompt_length", limit, f.input_tokens, got, "prompts")


def check_output_length(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_output_drift_pct)
    if f.ignore_eos is None or not f.output_tokens:
        why = "whether the workload fixes the output length is not recorded"
        return Flag("output_length", NOT_CHECKED, None, limit, why)
    if not f.ignore_eos:
        why = "the workload does not fix the output length (ignore_eos false)"
        return Flag("output_length", NOT_CHECKED, None, limit, why)
    got = [int(r.output_tokens) for r in f.requests if r.completed and r.output_tokens is not None]
    if not got:
        return Flag("output_length", NOT_CHECKED, None, limit, "no completed request")
    return _drift("output_length", limit, f.output_tokens, got, "outputs")


def check_achieved_concurrency(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.min_achieved_concurrency)
    if not f.concurrency:
        why = "requested concurrency not recorded"
        return Flag("achieved_concurrency", NOT_CHECKED, None, limit, why)
    if f.achieved_concurrency is None:
        why = "send times not recorded, or every request was sent at once"
        return Flag("achieved_concurrency", NOT_CHECKED, None, limit, why)
    share = f.achieved_concurrency / f.concurrency
    said = (
        f"{f.achieved_concurrency:.2f} requests in flight on average while sending, "
        f"for {f.concurrency} requested"
    )
    if share < limit:
        return Flag("achieved_concurrency", FAILED, share, limit, f"{said} (minimum {_pct(limit)})")
    return Flag("achieved_concurrency", PASSED, share, limit, said)


def check_client_cpu(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_client_cpu_cores)
    cpu = _block(f.telemetry or {}, "cpu")
    pct = _mean(cpu, "client_cpu_pct")
    if pct is not None:
        cores, source = pct / 100.0, "telemetry"
    elif f.client_cpu_s is not None and f.window_s:
        cores, source = float(f.client_cpu_s) / f.window_s, "process time"
    else:
        return Flag("client_cpu", NOT_CHECKED, None, limit, "client CPU not recorded")
    said = f"the client used {cores:.2f} CPU cores ({source})"
    if cores > limit:
        return Flag("client_cpu", FAILED, cores, limit, f"{said} (limit {_g(limit)})")
    return Flag("client_cpu", PASSED, cores, limit, said)


def check_client_wait(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_client_wait_pct)
    waits = [r.queued_us for r in f.requests if r.queued_us is not None]
    if not waits:
        return Flag("client_wait", NOT_CHECKED, None, limit, "client wait not recorded")
    e2el = [r.e2el_us for r in f.requests if r.e2el_us is not None]
    if not e2el:
        return Flag("client_wait", NOT_CHECKED, None, limit, "no completed request")
    wait_ms = sum(waits) / len(waits) / 1000.0
    e2el_ms = sum(e2el) / len(e2el) / 1000.0
    pct = 100.0 * wait_ms / e2el_ms if e2el_ms > 0 else 0.0
    said = (
        f"requests waited {wait_ms:.3g} ms on average (longest {max(waits) / 1000.0:.3g} ms) "
        f"between a free slot and their send, {pct:.2g}% of their mean latency "
        f"({e2el_ms:.4g} ms)"
    )
    if pct > limit:
        return Flag("client_wait", FAILED, pct, limit, f"{said} (limit {_g(limit)}%)")
    return Flag("client_wait", PASSED, pct, limit, said)


def _server_block(
    f: PointFacts, name: str, key: str, limit: float | None = None
) -> tuple[Mapping[str, Any], Flag | None]:
    """The telemetry's server block when it has counter `key`, else the check's not-checked
    flag saying why."""
    tel = f.telemetry
    why = None
    srv = _block(tel or {}, "server")
    if tel is None:
        why = f.no_telemetry
    elif tel.get("enabled") is False:
        why = "telemetry disabled"
    elif srv.get("absent"):
        why = f"no server metrics: {srv['absent']}"
    elif srv.get(key) is None:
        why = f"no server counter {key}"
    return srv, None if why is None else Flag(name, NOT_CHECKED, None, limit, why)


def check_leftover_requests(f: PointFacts, t: ValiditySection) -> Flag:
    if f.warmup_overlap_ns is not None:
        said = f"the warm-up ended {f.warmup_overlap_ns / 1e6:.1f} ms after the point began"
        return Flag("leftover_requests", FAILED, f.warmup_overlap_ns / 1e6, 0.0, said)
    srv, skip = _server_block(f, "leftover_requests", "requests_finished")
    if skip is not None:
        return skip
    server_n, client_n = float(srv["requests_finished"]), len(f.requests)
    extra = server_n - client_n
    said = (
        f"the server finished {_g(server_n)} requests during the point, the client sent {client_n}"
    )
    if extra > 0:
        return Flag(
            "leftover_requests",
            FAILED,
            extra,
            0.0,
            f"{said}: {_g(extra)} from before the point (warm-up or an earlier point)",
        )
    if extra < 0:
        # every request the client saw end was finished by the engine before the sample that
        # closes the window: fewer means the counters do not describe this point
        why = f"{said}: the server's counter misses {_g(-extra)}"
        return Flag("leftover_requests", FAILED, extra, 0.0, why)
    return Flag("leftover_requests", PASSED, 0.0, 0.0, said)


def check_server_counts(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_count_mismatch_pct)
    srv, skip = _server_block(f, "server_counts", "generation_tokens", limit)
    if skip is not None:
        return skip
    done = [r for r in f.requests if r.completed]
    pairs = [("output", float(srv["generation_tokens"]), sum(r.output_tokens or 0 for r in done))]
    if srv.get("prompt_tokens") is not None:
        pairs.append(
            ("prompt", float(srv["prompt_tokens"]), sum(r.prompt_tokens or 0 for r in done))
        )
    worst, parts = 0.0, []
    for what, server_n, client_n in pairs:
        diff = abs(server_n - client_n) / max(client_n, 1) * 100
        worst = max(worst, diff)
        parts.append(f"{what} tokens: server {_g(server_n)}, client {client_n}")
    said = "; ".join(parts)
    if worst > limit:
        return Flag("server_counts", FAILED, worst, limit, f"{said} (limit {_g(limit)}%)")
    return Flag("server_counts", PASSED, worst, limit, said)


CHECKS: tuple[Check, ...] = (
    Check(
        "streaming",
        f"share of completed requests with at least {BURST_MIN_TOKENS} output tokens whose "
        f"content arrived in at most {BURST_MAX_READS} reads",
        LATENCY,
        "max_burst_share",
        check_streaming,
    ),
    Check(
        "contention",
        "host CPU busy outside the server, the client and the samplers, in cores, over the "
        "point (telemetry)",
        ALL,
        "max_other_cpu_cores",
        check_contention,
    ),
    Check(
        "failed_requests",
        "requests that failed or carried no content",
        ALL,
        "max_failed_requests",
        check_failed_requests,
    ),
    Check(
        "restarted_requests",
        "preemptions the server counted during the point (telemetry); a note, never excluding",
        NONE,
        None,
        check_restarted_requests,
    ),
    Check(
        "min_duration",
        "point duration, first send to last completion (s)",
        ALL,
        "min_point_duration_s",
        check_min_duration,
    ),
    Check(
        "chunk_tokens",
        "share of streamed chunks carrying more tokens than the server's configuration puts in "
        "one (1, or 1 + k with speculative decoding), from the server's per-chunk usage",
        ITL,
        "max_merged_chunk_share",
        check_chunk_tokens,
    ),
    Check(
        "first_token",
        "requests whose first chunk carried no output, neither text nor a token (TTFT is the "
        "first chunk that does: a note), or whose chunks carry none at all (failed)",
        TTFT,
        None,
        check_first_token,
    ),
    Check(
        "prefix_cache",
        "share of prompt tokens served from the server's prefix cache when the configuration "
        "did not enable caching (a note when it did)",
        ALL,
        "max_prefix_cache_hit_rate",
        check_prefix_cache,
    ),
    Check(
        "prompt_length",
        "largest difference between a request's usage.prompt_tokens and the requested "
        "input_tokens (%)",
        ALL,
        "max_prompt_drift_pct",
        check_prompt_length,
    ),
    Check(
        "output_length",
        "largest difference between a request's usage.completion_tokens and the requested "
        "output_tokens when the workload fixes it (ignore_eos) (%)",
        ALL,
        "max_output_drift_pct",
        check_output_length,
    ),
    Check(
        "achieved_concurrency",
        "time-weighted requests in flight from the first send to the last, as a share of the "
        "requested concurrency",
        ALL,
        "min_achieved_concurrency",
        check_achieved_concurrency,
    ),
    Check(
        "client_cpu",
        "CPU cores the client process used over the point",
        ALL,
        "max_client_cpu_cores",
        check_client_cpu,
    ),
    Check(
        "client_wait",
        "mean time a request waited in the client between its slot becoming free and its "
        "send, in percent of the mean request latency (E2EL)",
        ALL,
        "max_client_wait_pct",
        check_client_wait,
    ),
    Check(
        "leftover_requests",
        "requests the server finished during the point against those the client sent in it "
        "(more: warm-up or earlier requests leaking in; fewer: counters that do not describe "
        "the point), and a warm-up that ended after the point began",
        ALL,
        None,
        check_leftover_requests,
    ),
    Check(
        "server_counts",
        "largest difference between the client's output and prompt token totals and the "
        "server's counters over the point (%)",
        ALL,
        "max_count_mismatch_pct",
        check_server_counts,
    ),
)
BY_NAME = {c.name: c for c in CHECKS}


def evaluate(facts: PointFacts, t: ValiditySection) -> tuple[Flag, ...]:
    return tuple(c.run(facts, t) for c in CHECKS)


def check_point(
    records: Sequence[RequestRecord],
    meta: Mapping[str, Any],
    t: ValiditySection,
    server_args: Mapping[str, Any] | None = None,
    warmup: Mapping[str, Any] | None = None,
) -> tuple[Flag, ...]:
    """Every check on one point of servelab's layout (records, point.json, the configuration's
    launch arguments, the warm-up's point.json)."""
    return evaluate(facts_from_records(records, meta, server_args, warmup), t)


def removing(flags: Iterable[Flag], metric: str) -> list[Flag]:
    """The failed flags that leave `metric` out of the statistics."""
    return [f for f in flags if f.status == FAILED and BY_NAME[f.check].removes(metric)]


def failed(flags: Iterable[Flag]) -> list[Flag]:
    return [f for f in flags if f.status == FAILED]


# --- what the report, validity.json and the end-of-run summary say ----------------------------

PointFlags = tuple[str, int, int, Sequence[Flag]]  # server_config, repeat, concurrency, flags


def point_label(server_config: str, repeat: int, concurrency: int) -> str:
    return f"rep{repeat:02d} c={concurrency} {server_config}"


def counts(points: Sequence[PointFlags]) -> dict[str, dict[str, int]]:
    """check -> status -> number of points."""
    out = {c.name: dict.fromkeys(STATUSES, 0) for c in CHECKS}
    for *_, flags in points:
        for f in flags:
            out[f.check][f.status] += 1
    return out


def validity_json(points: Sequence[PointFlags], t: ValiditySection) -> dict[str, Any]:
    rows = sorted(points, key=lambda p: (p[0], p[2], p[1]))
    return {
        "format_version": FORMAT_VERSION,
        "thresholds": thresholds_json(t),
        "checks": [
            {
                "name": c.name,
                "definition": c.definition,
                "affects": c.affects,
                "threshold_key": f"{SECTION}.{c.threshold_key}" if c.threshold_key else None,
                "threshold": c.threshold(t),
            }
            for c in CHECKS
        ],
        "counts": counts(rows),
        "points": [
            {
                "server_config": sc,
                "repeat": rep,
                "concurrency": conc,
                "valid": not failed(flags),
                "checks": [f.to_json() for f in flags],
            }
            for sc, rep, conc, flags in rows
        ],
    }


def summary_line(points: Sequence[PointFlags], anchor: str = "analysis/report.md#validity") -> str:
    """One line for the end of a run: how many points were flagged and by which checks."""
    n = len(points)
    if n == 0:
        return "validity: no measured point"
    c = counts(points)
    flagged = sum(1 for *_, flags in points if failed(flags))
    excluding = [k.name for k in CHECKS if k.affects != NONE]
    if flagged:
        by = ", ".join(f"{k} {c[k][FAILED]}" for k in excluding if c[k][FAILED])
        line = f"validity: {flagged} of {n} points flagged ({by}); see {anchor}"
    elif any(c[k][NOT_CHECKED] < n for k in excluding):
        ran = [k for k in excluding if c[k][NOT_CHECKED] < n]
        line = f"validity: all {n} points passed the {len(ran)} checks that could run"
    else:
        return f"validity: no check could run on the {n} points (no requests or telemetry)"
    skipped = [k for k in excluding if c[k][NOT_CHECKED] == n]
    if skipped:
        line += f"; not checked: {', '.join(skipped)}"
    noted = {k.name: c[k.name][NOTED] for k in CHECKS if k.affects == NONE and c[k.name][NOTED]}
    for name, k in noted.items():
        line += f"; {name} noted on {k} point{'s' if k != 1 else ''} (not excluded)"
    return line
