"""SLO capacity by search, and steady state, against a server of known capacity: a real open
loop against the scripted one-at-a-time server (tests/queue_server.py). Its answer depends on the scripted
server getting the CPU it asks for, so it is marked e2e and runs with the real-server tests
(tests/conftest.py), beside no vLLM server; tests/test_search.py has the rest."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from queue_server import serve_queue

from servelab.analysis.search import (
    RateOutcome,
    RepeatOutcome,
    SearchSpec,
    SloBounds,
    search_rate,
    slo_attainment,
)
from servelab.client import OpenLoop, RequestSettings, run_point
from servelab.design.arrivals import ArrivalProcess

# its answer is measured timing (a queue of 25-ms services): alone on the host (`quiet`,
# tests/conftest.py), as a real server's verdict is
pytestmark = [pytest.mark.e2e, pytest.mark.quiet]

# --- the known answer: a server of known capacity -------------------------------------------

# One request at a time, 25 ms each: a capacity of 40 req/s. The bound leaves 50 ms for the
# client's own lateness (a late send, a late read) before a request that did not queue misses
# it: 10 ms, with a 10-ms service, failed rates at 90% load under hypervisor steal.
SERVICE_S = 0.025
N = 60
BOUND_MS = 75.0  # end-to-end, from the scheduled send
TARGET = 0.9


def threshold_rate(service_s: float, bound_s: float, n: int, target: float) -> float:
    """The highest constant rate at which at least `target` of n requests end within `bound_s`
    of their scheduled send, for a server that serves one at a time, `service_s` each. Below
    1 / service_s nothing queues (every latency is service_s); above, request i (from 0) waits
    i (service_s - 1 / rate), so it meets the bound while i <= (bound_s - service_s) /
    (service_s - 1 / rate), and ceil(target n) requests meet it while that holds for
    i = ceil(target n) - 1."""
    k = math.ceil(target * n) - 1
    return 1 / (service_s - (bound_s - service_s) / k)


@pytest.fixture(scope="module")
def queue() -> Iterator[str]:
    with serve_queue(SERVICE_S) as base:
        yield base


def test_the_search_finds_the_capacity_of_a_known_server(queue: str) -> None:
    """Constant arrivals at a deterministic single server of capacity 1/S = 40 req/s: up to
    40 req/s no request queues; above, the queue grows by S - 1/rate each request. With 60
    requests a rate, 90% of them within 75 ms: the rates up to 40 req/s meet the SLO (0 of 60
    over: the early-stop upper bound 4.9% is within the 10% allowed), those above 41.6 req/s
    (threshold_rate) fail it; a rate close above the threshold, undecided, is measured again
    (the same requests, deterministic) and counts as not meeting. The search (start 15 req/s, doubling, 5%
    tolerance) ends with a bracket at most 5% wide that holds the capacity, to within one
    bisection step (the last bracket's width: a rate measured at the very threshold may land
    on either side). About 12 s."""
    lo_true = 1 / SERVICE_S
    hi_true = threshold_rate(SERVICE_S, BOUND_MS / 1e3, N, TARGET)
    assert 40 < hi_true < 41.6
    w = RequestSettings(base_url=queue, model="m", max_tokens=1, request_timeout_s=30)
    bounds = SloBounds(e2el_ms=BOUND_MS)

    def measure(rate: float, round_: int) -> RateOutcome:
        plan = OpenLoop.of(ArrivalProcess("constant", rate), N)
        run = run_point(w, ["p"] * N, plan, f"r{rate:g}")
        attainment = slo_attainment(run.records, bounds)
        failed = sum(not r.ok for r in run.records)
        reasons = (f"{failed} failed requests",) if failed else ()
        return RateOutcome((RepeatOutcome(attainment, not failed, len(run.records), reasons),))

    r = search_rate(measure, SearchSpec(15, bounds, target=TARGET, tolerance=0.05))
    trace = [(s.rate, s.outcome.repeats[0].attainment) for s in r.path]
    a = r.answer
    assert a.stopped == "converged" and a.bracket is not None, (a, trace)
    lo, hi = a.bracket
    width = hi - lo
    assert hi / lo - 1 <= 0.05, trace
    assert lo - width <= hi_true and hi + width >= lo_true, (a, trace)
    # what queueing theory says of the rates far from the threshold
    for s in r.path:
        if s.rate <= 0.95 * lo_true or s.rate >= 1.05 * hi_true:
            assert s.meets is (s.rate < lo_true), (s.rate, trace)


# --- steady state: an open loop past capacity ------------------------------------------------


def test_an_open_loop_at_twice_capacity_fails_steady_state(queue: str) -> None:
    """The same single server of capacity 40 req/s, driven at 80 req/s: every request waits
    12.5 ms longer than the one before, a queue that grows over the point, so `steady_state`
    fails it (TTFT and E2EL grow by about twice their median across 120 requests); at 20 req/s
    nothing queues and it passes. About 8 s."""
    from servelab.analysis.validity import check_point
    from servelab.config import default_section
    from servelab.experiment import ValiditySection

    thresholds = default_section(ValiditySection, "analysis", "validity")
    w = RequestSettings(base_url=queue, model="m", max_tokens=1, request_timeout_s=30)
    past = run_point(w, ["p"] * 120, OpenLoop.of(ArrivalProcess("constant", 80.0), 120), "r80")
    flag = {f.check: f for f in check_point(past.records, {}, thresholds)}["steady_state"]
    assert flag.status == "failed" and flag.value is not None and flag.value > 1.0, flag
    assert "grew over the point, not a steady state" in flag.reason, flag
    half = run_point(w, ["p"] * 60, OpenLoop.of(ArrivalProcess("constant", 20.0), 60), "r20")
    flag = {f.check: f for f in check_point(half.records, {}, thresholds)}["steady_state"]
    assert flag.status == "passed", flag
