"""The checks for the measurement mistakes other serving benchmarks are known for
(docs/pitfalls.md): merged chunks, a first chunk without output, prefix-cache hits, prompt and
output lengths off the request, concurrency not reached, a busy or lagging client, requests
leaking in from the warm-up, and client totals that disagree with the server's counters."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from servelab.analysis.validity.facts import PointFacts, RequestFacts, integer, number
from servelab.analysis.validity.flags import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    block,
    block_mean,
    number_text,
    share_text,
)
from servelab.experiment import ValiditySection


def _arg(args: Mapping[str, object] | None, *names: str) -> object:
    if not args:
        return None
    for name in names:
        for key in (name, name.replace("-", "_")):
            if key in args:
                return args[key]
    return None


def tokens_per_chunk_allowed(args: Mapping[str, object] | None) -> int:
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
        return 1 + max(0, integer(k)) if k is not None else 1
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
        return Flag("chunk_tokens", FAILED, share, limit, f"{said} (limit {share_text(limit)})")
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


def caching_asked(args: Mapping[str, object] | None) -> bool:
    v = _arg(args, "enable-prefix-caching")
    return v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes"))


def served_from_cache(f: PointFacts) -> tuple[float, float, str] | None:
    """(prompt tokens the prefix cache served, prompt tokens looked up, where from): the
    server's counters over the point, else the requests' cached tokens; None: neither."""
    srv = block(f.telemetry or {}, "server")
    queries, hits = srv.get("prefix_cache_queries"), srv.get("prefix_cache_hits")
    if queries is not None and hits is not None:
        return number(hits), number(queries), "server counters"
    cached = [r for r in f.requests if r.cached_tokens is not None]
    if not cached:
        return None
    hits = sum(int(r.cached_tokens or 0) for r in cached)
    queries = sum(int(r.prompt_tokens or 0) for r in cached)
    return float(hits), float(queries), "per-request cached tokens"


def check_prefix_cache(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_prefix_cache_hit_rate)
    found = served_from_cache(f)
    if found is None:
        srv = block(f.telemetry or {}, "server")
        why = f.no_telemetry if f.telemetry is None else "no prefix-cache counters"
        if srv.get("absent"):
            why = f"no server metrics: {srv['absent']}"
        return Flag("prefix_cache", NOT_CHECKED, None, limit, why)
    hits, queries, source = found
    if not queries:
        return Flag("prefix_cache", PASSED, 0.0, limit, "no prompt tokens looked up")
    rate = float(hits) / float(queries)
    got, asked = number_text(float(hits)), number_text(float(queries))
    said = f"{got} of {asked} prompt tokens came from the prefix cache"
    # a workload that shares prefixes (point.json `shared_prefix`) asks for hits: with caching
    # enabled they are a note beside the share it intends (`reuse_ratio`); with caching off the
    # server should have served none, so hits above the limit fail as for any point
    shared = f.shared_prefix is not None or f.trace is not None
    if caching_asked(f.server_args):
        enabled = "(caching enabled by the configuration)"
        why = f"{said} ({rate:.2f}); the workload shares prefixes: {_intended(f)} {enabled}"
        return Flag("prefix_cache", NOTED, rate, limit, why if shared else f"{said} {enabled}")
    if rate > limit:
        return Flag(
            "prefix_cache",
            FAILED,
            rate,
            limit,
            f"{said} ({source}; the configuration did not ask for caching; "
            f"limit {share_text(limit)})",
        )
    if shared:
        said += "; the workload shares prefixes but the configuration did not enable caching"
    return Flag("prefix_cache", PASSED, rate, limit, said)


def _intended(f: PointFacts) -> str:
    """The share of prompt tokens a shared-prefix workload means the cache to serve."""
    intended = (f.shared_prefix or block(f.trace or {}, "reuse")).get("reuse_ratio")
    if isinstance(intended, (int, float)):
        return f"{float(intended):.2f} intended"
    return "the share it intends is not known"


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
            f"{len(off)} of {len(got)} requests: {said} (limit {number_text(limit)}%)",
        )
    return Flag(name, PASSED, 100 * worst, limit, said)


def _asked_and_got(
    f: PointFacts,
    point: int | None,
    asked: Callable[[RequestFacts], int | None],
    got: Callable[[RequestFacts], int | None],
) -> tuple[list[tuple[int, int]], int]:
    """(requested, measured) length of every completed request that has both: its own
    requested length, else the point's (`point`); and how many measured ones had neither."""
    pairs, left = [], 0
    for r in f.requests:
        n = got(r)
        if not r.completed or n is None:
            continue
        want = asked(r) or point
        if want:
            pairs.append((int(want), int(n)))
        else:
            left += 1
    return pairs, left


def _drift_each(
    name: str, limit: float, pairs: list[tuple[int, int]], left: int, what: str
) -> Flag:
    """Every request against its own requested length. One length for all of them reads as it
    always has (`_drift`)."""
    wanted = {w for w, _ in pairs}
    if len(wanted) == 1 and not left:
        return _drift(name, limit, wanted.pop(), [g for _, g in pairs], what)
    drift = [(abs(g - w) / w * 100, w, g) for w, g in pairs]
    worst, w, g = max(drift)
    off = sum(1 for d, _, _ in drift if d > limit)
    got = [g for _, g in pairs]
    lo, hi = min(got), max(got)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    worst_said = f"the worst {g} tokens for {w} requested"
    rest = f"; left out: {left} without a requested length" if left else ""
    if off:
        said = (
            f"{off} of {len(pairs)} requests: {what} off their requested length by more than "
            f"{number_text(limit)}% ({worst_said}){rest}"
        )
        return Flag(name, FAILED, worst, limit, said)
    n = f"{len(pairs)} requests" if len(pairs) > 1 else "1 request"
    if worst == 0:
        said = f"{n}: {what} of {span} tokens, each as long as requested{rest}"
    else:
        said = (
            f"{n}: {what} of {span} tokens, each within {number_text(limit)}% of its requested "
            f"length ({worst_said}){rest}"
        )
    return Flag(name, PASSED, worst, limit, said)


def check_prompt_length(f: PointFacts, t: ValiditySection) -> Flag:
    """Each completed request's usage.prompt_tokens against the length it was built to (its
    own, else the point's one length). Not for chat turns, whose prompts hold the history."""
    limit = float(t.max_prompt_drift_pct)
    if f.chat_turns is not None:
        why = (
            "chat turns: a turn's prompt holds the chat template and the conversation's "
            "history besides the user message"
        )
        return Flag("prompt_length", NOT_CHECKED, None, limit, why)
    if not f.input_tokens and not any(r.asked_input_tokens for r in f.requests):
        return Flag("prompt_length", NOT_CHECKED, None, limit, "requested length not recorded")
    pairs, left = _asked_and_got(
        f, f.input_tokens, lambda r: r.asked_input_tokens, lambda r: r.prompt_tokens
    )
    if not pairs and not left:
        return Flag("prompt_length", NOT_CHECKED, None, limit, "no usage.prompt_tokens recorded")
    if not pairs:
        why = "no completed request recorded the length it asked for"
        return Flag("prompt_length", NOT_CHECKED, None, limit, why)
    return _drift_each("prompt_length", limit, pairs, left, "prompts")


def check_output_length(f: PointFacts, t: ValiditySection) -> Flag:
    """Each completed request's usage.completion_tokens against its own max_tokens, else the
    point's one output length, when the workload fixes the output length (ignore_eos)."""
    limit = float(t.max_output_drift_pct)
    asked = f.output_tokens or any(r.asked_output_tokens for r in f.requests)
    if f.ignore_eos is None or not asked:
        why = "whether the workload fixes the output length is not recorded"
        return Flag("output_length", NOT_CHECKED, None, limit, why)
    if not f.ignore_eos:
        why = "the workload does not fix the output length (ignore_eos false)"
        return Flag("output_length", NOT_CHECKED, None, limit, why)
    pairs, left = _asked_and_got(
        f, f.output_tokens, lambda r: r.asked_output_tokens, lambda r: r.output_tokens
    )
    if not pairs and not left:
        return Flag("output_length", NOT_CHECKED, None, limit, "no completed request")
    if not pairs:
        why = "no completed request recorded the length it asked for"
        return Flag("output_length", NOT_CHECKED, None, limit, why)
    return _drift_each("output_length", limit, pairs, left, "outputs")


def check_achieved_concurrency(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.min_achieved_concurrency)
    if not f.concurrency:
        why = "requested concurrency not recorded"
        return Flag("achieved_concurrency", NOT_CHECKED, None, limit, why)
    if f.think_time_s:
        why = (
            f"chat: a conversation waits {number_text(f.think_time_s)} s between a reply and its "
            "next turn, its slot idle by design"
        )
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
        return Flag(
            "achieved_concurrency", FAILED, share, limit, f"{said} (minimum {share_text(limit)})"
        )
    return Flag("achieved_concurrency", PASSED, share, limit, said)


def check_client_cpu(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_client_cpu_cores)
    if f.worker_busy:  # several client processes: the busiest one is the bottleneck
        busiest = max(f.worker_busy)
        k = f.worker_busy.index(busiest) + 1
        said = (
            f"the busiest of {len(f.worker_busy)} client workers (worker {k}) used "
            f"{busiest:.2f} of a CPU core"
        )
        if busiest > limit:
            return Flag(
                "client_cpu", FAILED, busiest, limit, f"{said} (limit {number_text(limit)})"
            )
        return Flag("client_cpu", PASSED, busiest, limit, said)
    cpu = block(f.telemetry or {}, "cpu")
    pct = block_mean(cpu, "client_cpu_pct")
    if pct is not None:
        cores, source = pct / 100.0, "telemetry"
    elif f.client_cpu_s is not None and f.window_s:
        cores, source = float(f.client_cpu_s) / f.window_s, "process time"
    else:
        return Flag("client_cpu", NOT_CHECKED, None, limit, "client CPU not recorded")
    said = f"the client used {cores:.2f} CPU cores ({source})"
    if cores > limit:
        return Flag("client_cpu", FAILED, cores, limit, f"{said} (limit {number_text(limit)})")
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
        return Flag("client_wait", FAILED, pct, limit, f"{said} (limit {number_text(limit)}%)")
    return Flag("client_wait", PASSED, pct, limit, said)


def _server_block(
    f: PointFacts, name: str, key: str, limit: float | None = None
) -> tuple[Mapping[str, object], Flag | None]:
    """The telemetry's server block when it has counter `key`, else the check's not-checked
    flag saying why."""
    tel = f.telemetry
    why = None
    srv = block(tel or {}, "server")
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
    server_n, client_n = number(srv["requests_finished"]), len(f.requests)
    extra = server_n - client_n
    said = (
        f"the server finished {number_text(server_n)} requests during the point, "
        f"the client sent {client_n}"
    )
    if extra > 0:
        return Flag(
            "leftover_requests",
            FAILED,
            extra,
            0.0,
            f"{said}: {number_text(extra)} from before the point (warm-up or an earlier point)",
        )
    if extra < 0:
        # every request the client saw end was finished by the engine before the sample that
        # closes the window: fewer means the counters do not describe this point
        why = f"{said}: the server's counter misses {number_text(-extra)}"
        return Flag("leftover_requests", FAILED, extra, 0.0, why)
    return Flag("leftover_requests", PASSED, 0.0, 0.0, said)


def check_server_counts(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_count_mismatch_pct)
    srv, skip = _server_block(f, "server_counts", "generation_tokens", limit)
    if skip is not None:
        return skip
    done = [r for r in f.requests if r.completed]
    pairs = [("output", number(srv["generation_tokens"]), sum(r.output_tokens or 0 for r in done))]
    if srv.get("prompt_tokens") is not None:
        pairs.append(
            ("prompt", number(srv["prompt_tokens"]), sum(r.prompt_tokens or 0 for r in done))
        )
    worst, parts = 0.0, []
    for what, server_n, client_n in pairs:
        diff = abs(server_n - client_n) / max(client_n, 1) * 100
        worst = max(worst, diff)
        parts.append(f"{what} tokens: server {number_text(server_n)}, client {client_n}")
    said = "; ".join(parts)
    if worst > limit:
        return Flag("server_counts", FAILED, worst, limit, f"{said} (limit {number_text(limit)}%)")
    return Flag("server_counts", PASSED, worst, limit, said)
