"""What the checks read of one point (PointFacts, one RequestFacts per request), built from
either raw layout: servelab's (requests.jsonl.gz, point.json, launch arguments, the warm-up)
or a `vllm bench serve --save-detailed` benchmark.json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict, cast

from servelab.client import RequestRecord
from servelab.design.level import Level

# streaming: a request is burst-delivered when its content came in at most this many reads
# while it has at least BURST_MIN_TOKENS output tokens (fewer tokens fit in two reads anyway)
BURST_MAX_READS = 2
BURST_MIN_TOKENS = 4
# vllm-bench trees keep one timestamp per chunk, not per read: chunks of one read are
# microseconds apart, so gaps under this count as the same read
BENCH_SAME_READ_S = 1e-4


class BenchJson(TypedDict, total=False):
    """A `vllm bench serve --save-result --save-detailed` benchmark.json, as far as servelab
    reads it: per request (in send order) its TTFT, inter-token gaps and latency (s), its
    lengths and error (empty when it succeeded), its send time and wait for a slot (s, newer
    versions); the run's duration (s), --max-concurrency, --request-rate (a number, or as given),
    --burstiness and --ramp-up-strategy. vLLM's file, not servelab's: none is checked beyond
    the keys the reader needs (`vllm_bench_metrics`)."""

    # None: a request the tool completed without timing its first token (GuideLLM's whose
    # output carried no text; servelab.analysis.peers)
    ttfts: list[float | None]
    itls: list[list[float] | None]
    latencies: list[float]
    output_lens: list[int]
    input_lens: list[int | None]
    errors: list[str]
    start_times: list[float]
    queue_times: list[float]
    duration: float
    max_concurrency: int | None
    request_rate: float | str | None
    burstiness: float | None
    ramp_up_strategy: str | None
    # another tool's results (servelab.analysis.peers): the tool's own count of each request's
    # output tokens (a re-tokenization of its text), where it differs in kind from output_lens
    client_output_lens: list[int | None]
    # another tool's wait in its client between a request falling due (a free slot) and its
    # send (s; servelab.analysis.peers: AIPerf's credit to start, GuideLLM's dispatch delay)
    client_waits: list[float | None]
    # another tool's run that sent on send times it was handed in its dataset (AIPerf's
    # --fixed-schedule) rather than drawing them from a process
    fixed_schedule: bool


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
    # open loop: the scheduled send (epoch ns), how late the actual send was, and when the
    # request ended (epoch ns; None when it never started); None in a closed loop
    scheduled_ns: int | None = None
    send_slip_us: int | None = None
    end_ns: int | None = None
    # the lengths this request itself asked for (the record's `input_tokens`, prefix included,
    # and `max_tokens`): drawn lengths, a dataset's; None when the point's own apply (point.json
    # `input_tokens` / `output_tokens`) or nothing was recorded
    asked_input_tokens: int | None = None
    asked_output_tokens: int | None = None
    # a completed request's TTFT and E2EL (ms) as the point's metrics count them
    # (servelab.metrics.request_latencies); None for one that did not complete, or whose first
    # token (whose end) another tool did not time
    ttft_ms: float | None = None
    e2el_ms: float | None = None
    # when it was sent (epoch ns; an open loop's scheduled send), which orders the requests in
    # send order; None when not recorded (a vllm-bench tree's requests are in send order)
    sent_ns: int | None = None
    # a multi-turn chat's turn number in its conversation (from 1); None for a single request
    turn: int | None = None


@dataclass(frozen=True)
class PointFacts:
    """What the checks read of one point, from either raw layout."""

    requests: tuple[RequestFacts, ...]
    duration_s: float | None  # first send to last completion; None when nothing completed
    telemetry: Mapping[str, object] | None  # point.json's `telemetry` block
    no_telemetry: str = "no telemetry recorded"
    # what the point asked for (point.json); None when not recorded. input_tokens and
    # output_tokens only when every request asked that one length (an int in point.json), not
    # for lengths drawn per request (a {min, max} or {values} distribution) nor a dataset's
    concurrency: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    ignore_eos: bool | None = None
    # the server configuration's arguments (launch.json `args`); None when not recorded
    server_args: Mapping[str, object] | None = None
    # time-weighted requests in flight, first send to last send (servelab.metrics)
    achieved_concurrency: float | None = None
    # client CPU seconds over the point's window, when the telemetry block lacks it
    client_cpu_s: float | None = None
    window_s: float | None = None
    # the warm-up of the same server launch ended after the point's first send (ns); None when
    # it ended before, or nothing says
    warmup_overlap_ns: int | None = None
    # an open-loop point: its request rate and point.json `arrival` (the schedule's process,
    # cap, requests, own rate); None for a closed-loop point
    rate: float | None = None
    arrival: Mapping[str, object] | None = None
    # point.json `client_workers`: each client process's busy share (CPU over wall time);
    # None when the point was sent from one process
    worker_busy: tuple[float, ...] | None = None
    # point.json `shared_prefix`: what the workload means the prefix cache to serve (its
    # `reuse_ratio`, servelab.workload.synthetic.intended_reuse); None when the requests
    # share no prefix
    shared_prefix: Mapping[str, object] | None = None
    # point.json `chat`: user turns per conversation and the think time between a reply and
    # the next turn (s); None when the point sent single requests
    chat_turns: int | None = None
    think_time_s: float | None = None
    # point.json `trace`: a trace replay's window, time scale and the reuse it implies
    # (servelab.measure.sending); None for any other workload
    trace: Mapping[str, object] | None = None

    @property
    def open_loop(self) -> bool:
        """An open-loop point: it has a request rate (the open-loop checks read it alone)."""
        return self.rate is not None


def number(v: object) -> float:
    """A number a JSON block holds, as float(v) reads it; a TypeError where it is none."""
    if isinstance(v, int | float | str):
        return float(v)
    raise TypeError(f"not a number: {v!r}")


def integer(v: object) -> int:
    """A count a JSON block holds, as int(v) reads it; a TypeError where it is none."""
    if isinstance(v, int | float | str):
        return int(v)
    raise TypeError(f"not a number: {v!r}")


def _int_or_none(v: object) -> int | None:
    return None if v is None or isinstance(v, bool) else integer(v)


def _float_or_none(v: object) -> float | None:
    """A number as point.json holds it (an int stays an int); None when absent."""
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _fixed_length(v: object) -> int | None:
    """point.json `input_tokens` / `output_tokens` when it is one length for every request;
    None for a distribution ({min, max} or {values}) or when absent (a dataset)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def facts_from_records(
    records: Sequence[RequestRecord],
    meta: Mapping[str, object],
    server_args: Mapping[str, object] | None = None,
    warmup: Mapping[str, object] | None = None,
) -> PointFacts:
    """servelab's layout: requests.jsonl.gz, point.json, the configuration's launch.json `args`
    and the warm-up's point.json (same server launch)."""
    from servelab.metrics import good, in_flight, point_duration, request_latencies

    reqs = []
    for r in records:
        done = good(r)
        lat = request_latencies(r) if done else None
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
                **_open_loop_times(r),
                asked_input_tokens=r.input_tokens,
                asked_output_tokens=r.max_tokens,
                ttft_ms=lat["ttft"] if lat is not None else None,
                e2el_ms=lat["e2el"] if lat is not None else None,
                sent_ns=r.sent_epoch_ns,
                turn=r.turn,
            )
        )
    # point.json's, as its schema has checked it: each slice's [start, end] (ns)
    slices = cast("list[list[int]] | None", meta.get("slices"))
    duration = point_duration(records, slices)
    telemetry = meta.get("telemetry")
    window = _window_s(meta.get("started_epoch_ns"), meta.get("finished_epoch_ns"), slices)
    overlap = None
    if warmup is not None and records and warmup.get("launch") == meta.get("launch"):
        first_send = min(r.sent_epoch_ns for r in records)
        wend = _int_or_none(warmup.get("finished_epoch_ns"))
        if wend is not None and wend > first_send:
            overlap = wend - first_send
    ignore_eos = meta.get("ignore_eos")
    shared = meta.get("shared_prefix")
    return PointFacts(
        tuple(reqs),
        duration,
        telemetry if isinstance(telemetry, Mapping) else None,
        concurrency=_int_or_none(meta.get("concurrency")),
        input_tokens=_fixed_length(meta.get("input_tokens")),
        output_tokens=_fixed_length(meta.get("output_tokens")),
        ignore_eos=ignore_eos if isinstance(ignore_eos, bool) else None,
        server_args=server_args,
        achieved_concurrency=in_flight(records, slices)[0],
        client_cpu_s=_float_or_none(meta.get("client_cpu_s")),
        window_s=window,
        warmup_overlap_ns=overlap,
        rate=number(rate) if (rate := meta.get("rate")) is not None else None,
        arrival=arrival if isinstance(arrival := meta.get("arrival"), Mapping) else None,
        worker_busy=_worker_busy(meta.get("client_workers")),
        shared_prefix=shared if isinstance(shared, Mapping) else None,
        trace=trace if isinstance(trace := meta.get("trace"), Mapping) else None,
        **_chat(meta.get("chat")),
    )


def _window_s(t0: object, t1: object, slices: list[list[int]] | None) -> float | None:
    """The seconds the client sent a point over (its client CPU is read against them): from
    its start to its end, or for a point sent in slices the sum of the slices' windows."""
    if slices:
        return sum(max(0, int(b) - int(a)) for a, b in slices) / 1e9 or None
    start, end = _int_or_none(t0), _int_or_none(t1)
    return (end - start) / 1e9 if start and end and end > start else None


class _ChatFacts(TypedDict, total=False):
    """PointFacts' chat_turns and think_time_s."""

    chat_turns: int | None
    think_time_s: float | None


def _chat(chat: object) -> _ChatFacts:
    """point.json `chat` as PointFacts' chat_turns and think_time_s; nothing without it."""
    if not isinstance(chat, Mapping):
        return {}
    think = chat.get("think_time_s")
    return {
        "chat_turns": _int_or_none(chat.get("turns")),
        "think_time_s": float(think) if isinstance(think, (int, float)) else None,
    }


def _worker_busy(workers: object) -> tuple[float, ...] | None:
    if not isinstance(workers, list) or not workers:
        return None
    return tuple(float(w.get("busy") or 0.0) for w in workers if isinstance(w, Mapping))


def _open_loop_times(r: RequestRecord) -> dict[str, int | None]:
    """An open-loop request's scheduled send, send slip and end (RequestFacts); nothing for a
    closed-loop request, which records no slip, nor for a conversation's later turn: it is due
    at the previous reply's end plus the think time, not on the arrival schedule the open-loop
    checks judge (its own slip is in requests.jsonl)."""
    if r.send_slip_us is None or (r.turn is not None and r.turn > 1):
        return {}
    end = r.sent_epoch_ns + r.done_offset_us * 1000 if r.done_offset_us is not None else None
    return {"scheduled_ns": r.sent_epoch_ns, "send_slip_us": r.send_slip_us, "end_ns": end}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * float(seconds)


def _bench_e2el_ms(
    ttft_s: float | None, gaps_s: list[float] | None, latencies_s: list[float], i: int
) -> float | None:
    """A vllm-bench request's E2EL (ms) as its metrics count it: its `latencies` entry, else
    its TTFT plus its inter-token gaps (None: neither recorded)."""
    if latencies_s:
        return 1000.0 * float(latencies_s[i])
    if ttft_s is None:
        return None
    return 1000.0 * (float(ttft_s) + sum(float(g) for g in gaps_s or []))


def facts_from_bench(
    bench: BenchJson,
    level: Level | None = None,
    arrival: Mapping[str, object] | None = None,
) -> PointFacts:
    """A `vllm bench serve --save-detailed` benchmark.json: per-request ITLs stand in for reads
    (gaps under BENCH_SAME_READ_S join one read) and chunks; no telemetry. A run at a request
    rate (`level` a rate, with its `arrival` summary) is an open-loop point, its
    --max-concurrency a cap on requests in flight, not its concurrency; vllm bench records no
    scheduled send times, so its requests have none (RequestFacts.scheduled_ns). A run at a
    concurrency (or no `level`) asked for its --max-concurrency."""
    n = len(bench["ttfts"])
    errors = bench.get("errors") or [""] * n
    itls = bench.get("itls") or [None] * n
    input_lens = bench.get("input_lens") or [None] * n
    latencies = bench.get("latencies") or []
    starts = bench.get("start_times") or []
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
                ttft_ms=_ms(bench["ttfts"][i]) if done else None,
                e2el_ms=_bench_e2el_ms(bench["ttfts"][i], gaps, latencies, i) if done else None,
                sent_ns=round(1e9 * float(starts[i])) if i < len(starts) else None,
            )
        )
    duration = float(bench["duration"]) if any(r.completed for r in reqs) else None
    facts = PointFacts(tuple(reqs), duration, None, no_telemetry="not recorded by vllm bench")
    if level is not None and level.is_rate:
        return replace(facts, rate=level.rate, arrival=arrival)
    return replace(facts, concurrency=_int_or_none(bench.get("max_concurrency")))
