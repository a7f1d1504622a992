"""Every check, in the order reports list them (CHECKS), and running them on a point."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from servelab.analysis.validity.facts import (
    BURST_MAX_READS,
    BURST_MIN_TOKENS,
    PointFacts,
    facts_from_records,
)
from servelab.analysis.validity.flags import (
    ALL,
    FAILED,
    ITL,
    LATENCY,
    NONE,
    TTFT,
    TTFT_E2EL,
    Check,
    Flag,
)
from servelab.analysis.validity.measurement import (
    check_contention,
    check_failed_requests,
    check_min_duration,
    check_restarted_requests,
    check_streaming,
)
from servelab.analysis.validity.openloop import (
    check_arrival_rate,
    check_cap_reached,
    check_send_slip,
)
from servelab.analysis.validity.pitfalls import (
    check_achieved_concurrency,
    check_chunk_tokens,
    check_client_cpu,
    check_client_wait,
    check_first_token,
    check_leftover_requests,
    check_output_length,
    check_prefix_cache,
    check_prompt_length,
    check_server_counts,
)
from servelab.analysis.validity.replay import check_trace_requests, check_trace_reuse
from servelab.analysis.validity.steady import MIN_REQUESTS, check_steady_state
from servelab.client import RequestRecord
from servelab.experiment import ValiditySection

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
    Check(
        "steady_state",
        "fitted change of TTFT and of E2EL across the point's successful requests in send "
        "order (Sen's slope x (n - 1)), as a share of their median; fails on growth above the "
        "threshold whose Mann-Kendall trend test has p below latency_trend_alpha (not checked "
        f"below {MIN_REQUESTS} requests)",
        TTFT_E2EL,
        "max_latency_trend",
        check_steady_state,
    ),
)
# the checks of an open-loop point only (servelab.analysis.validity.openloop), after the others
OPEN_LOOP_CHECKS: tuple[Check, ...] = (
    Check(
        "arrival_rate",
        "difference between the rate at which an open-loop point's requests were sent and the "
        "rate of the schedule they were due on (%)",
        ALL,
        "max_arrival_rate_error_pct",
        check_arrival_rate,
    ),
    Check(
        "send_slip",
        "90th percentile of how late an open-loop point's requests were sent after their "
        "scheduled time, leaving out those a full max_in_flight cap held back (ms)",
        ALL,
        "max_send_slip_ms",
        check_send_slip,
    ),
    Check(
        "cap_reached",
        "requests of an open-loop point due while every max_in_flight slot was busy, which "
        "waited for one; a note, never excluding",
        NONE,
        None,
        check_cap_reached,
    ),
)
# the checks of a trace replay only (servelab.analysis.validity.replay), after the open loop's
TRACE_CHECKS: tuple[Check, ...] = (
    Check(
        "trace_reuse",
        "prompt tokens the server's prefix cache served, as a share of the reuse the trace "
        "implies over the point's requests (where the configuration enables caching)",
        ALL,
        "min_trace_reuse",
        check_trace_reuse,
    ),
    Check(
        "trace_requests",
        "requests of the trace's window the point did not send (left out for max-model-len, "
        "or not sent), in percent of the window's",
        ALL,
        "max_trace_missing_pct",
        check_trace_requests,
    ),
)
# the checks of a closed loop that mean nothing in an open one (no slots to keep busy)
CLOSED_LOOP_ONLY = ("achieved_concurrency", "client_wait")
ALL_CHECKS = CHECKS + OPEN_LOOP_CHECKS + TRACE_CHECKS
BY_NAME = {c.name: c for c in ALL_CHECKS}


def checks_for(axis: str, trace: bool = False) -> tuple[Check, ...]:
    """The checks of a sweep over `axis`: CHECKS for concurrency; for rate, CHECKS without
    the closed loop's own, then OPEN_LOOP_CHECKS, then a trace replay's TRACE_CHECKS."""
    if axis == "rate":
        own = TRACE_CHECKS if trace else ()
        return tuple(c for c in CHECKS if c.name not in CLOSED_LOOP_ONLY) + OPEN_LOOP_CHECKS + own
    return CHECKS


def evaluate(facts: PointFacts, t: ValiditySection) -> tuple[Flag, ...]:
    axis = "rate" if facts.rate else "concurrency"
    return tuple(c.run(facts, t) for c in checks_for(axis, facts.trace is not None))


def check_point(
    records: Sequence[RequestRecord],
    meta: Mapping[str, object],
    t: ValiditySection,
    server_args: Mapping[str, object] | None = None,
    warmup: Mapping[str, object] | None = None,
) -> tuple[Flag, ...]:
    """Every check on one point of servelab's layout (records, point.json, the configuration's
    launch arguments, the warm-up's point.json)."""
    return evaluate(facts_from_records(records, meta, server_args, warmup), t)


def removing(flags: Iterable[Flag], metric: str) -> list[Flag]:
    """The failed flags that leave `metric` out of the statistics."""
    return [f for f in flags if f.status == FAILED and BY_NAME[f.check].removes(metric)]


def failed(flags: Iterable[Flag]) -> list[Flag]:
    return [f for f in flags if f.status == FAILED]
