"""The load generator spread over worker processes (client.workers): the point's requests are
all sent, each once, on one schedule and one clock bridge; each worker's share and busy share is
recorded; a stopped point keeps what finished; workers=1 is the one-process client."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from queue_server import serve_queue

import servelab.client.workers as workers_mod
from servelab.client import OpenLoop, PointRun, RequestRecord, RequestSettings, run_point
from servelab.client.workers import Share, SharedCount, worker_count
from servelab.design.arrivals import ArrivalProcess
from servelab.launch.ports import free_port

HERE = Path(__file__).resolve().parent
SERVICE_S = 0.005
SERVICE_US = round(SERVICE_S * 1e6)
TOKENS = 4


@pytest.fixture(scope="module")
def queue() -> Iterator[str]:
    """One request at a time, 5 ms each (tests/queue_server.py)."""
    with serve_queue(SERVICE_S) as base:
        yield base


@pytest.fixture(scope="module")
def streams() -> Iterator[str]:
    """Streams of one chunk per token, 10 ms apart, many requests at once
    (tests/fake_vllm_server.py)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_vllm_server.py"), "--host", "127.0.0.1", "--port",
         str(port)],
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wl(base: str, tokens: int = 1) -> RequestSettings:
    return RequestSettings(base_url=base, model="m", max_tokens=tokens, request_timeout_s=30)


def ids(label: str, n: int) -> list[str]:
    return [f"{label}-{i:05d}" for i in range(n)]


def in_flight_max(records: list[RequestRecord]) -> int:
    """The most requests in flight at once, from their sends and ends."""
    events = []
    for r in records:
        assert r.done_offset_us is not None
        start = r.sent_epoch_ns + (r.send_slip_us or 0) * 1000
        events += [(start, 1), (r.sent_epoch_ns + r.done_offset_us * 1000, -1)]
    most = now = 0
    for _, step in sorted(events):
        now += step
        most = max(most, now)
    return most


def check_workers(run: PointRun, requests: list[int]) -> None:
    """One entry per worker, its requests as given, its seconds and busy share sane."""
    assert [x["requests"] for x in run.workers] == requests
    point_s = (run.finished_epoch_ns - run.started_epoch_ns) / 1e9
    for x in run.workers:
        assert set(x) == {"requests", "cpu_s", "wall_s", "busy"}
        assert 0 < x["cpu_s"] and 0 < x["wall_s"] <= point_s + 1e-6, x
        assert x["busy"] == pytest.approx(x["cpu_s"] / x["wall_s"]) and 0 < x["busy"] < 1.5
    assert run.client_cpu_s == pytest.approx(sum(x["cpu_s"] for x in run.workers))


def test_closed_loop_two_workers_send_every_request_once(streams: str) -> None:
    """23 requests at concurrency 5 over 2 workers (3 + 2 slots): every request sent once,
    all of them streamed whole, more in flight at once than either worker's share."""
    run = run_point(wl(streams, TOKENS), [f"p{i}" for i in range(23)], 5, "c", workers=2)
    assert [r.request_id for r in run.records] == ids("c", 23)
    assert all(r.ok and len(r.chunk_offsets_us) == TOKENS for r in run.records)
    assert all(r.send_slip_us is None and r.queued_us is not None for r in run.records)
    assert 3 < in_flight_max(run.records) <= 5
    check_workers(run, [x["requests"] for x in run.workers])
    assert len(run.workers) == 2 and sum(x["requests"] for x in run.workers) == 23
    assert min(x["requests"] for x in run.workers) >= 2  # both took from the shared count
    for r in run.records:  # one clock bridge: every time inside the point's window
        assert r.done_offset_us is not None
        assert run.started_epoch_ns <= r.sent_epoch_ns
        assert r.sent_epoch_ns + r.done_offset_us * 1000 <= run.finished_epoch_ns + 1000


def test_records_are_the_one_process_records(streams: str) -> None:
    """The same fields, in the same order, and the same outcomes with 1 and 2 workers; with
    workers=1 no process is started."""
    prompts = ["p"] * 6
    two = run_point(wl(streams, TOKENS), prompts, 3, "s", workers=2)
    one = run_point(wl(streams, TOKENS), prompts, 3, "s", workers=1)
    plain = run_point(wl(streams, TOKENS), prompts, 3, "s")
    for run in (two, one, plain):
        assert [list(r.to_json()) for r in run.records] == [list(plain.records[0].to_json())] * 6
        assert [(r.request_id, r.ok, r.output_tokens, len(r.chunk_offsets_us), r.error)
                for r in run.records] == [(i, True, TOKENS, TOKENS, None)
                                          for i in ids("s", 6)]  # fmt: skip
    assert len(one.workers) == len(plain.workers) == 1 and len(two.workers) == 2
    check_workers(plain, [6])
    check_workers(one, [6])


def test_workers_one_stays_in_this_process(queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process() -> None:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(workers_mod, "_Worker", no_process)
    closed = run_point(wl(queue), ["p"] * 3, 2, "a", workers=1)
    plan = OpenLoop.of(ArrivalProcess("constant", 200), 3)
    opened = run_point(wl(queue), ["p"] * 3, plan, "b", workers=1)
    assert [r.request_id for r in closed.records + opened.records] == ids("a", 3) + ids("b", 3)
    with pytest.raises(AssertionError, match="a worker process was started"):
        run_point(wl(queue), ["p"] * 3, 2, "a", workers=2)


def test_open_loop_two_workers_keep_one_schedule(queue: str) -> None:
    """Constant arrivals every 10 ms dealt over 2 workers: each request's sent_epoch_ns is the
    point's zero plus its own send time, to the nanosecond, whichever worker sent it."""
    n = 30
    plan = OpenLoop.of(ArrivalProcess("constant", 100), n)
    run = run_point(wl(queue), ["p"] * n, plan, "o", workers=2)
    assert [r.request_id for r in run.records] == ids("o", n)
    assert all(r.ok for r in run.records), [r.error for r in run.records if not r.ok]
    assert [r.sent_epoch_ns - run.started_epoch_ns for r in run.records] == list(plan.offsets_ns)
    for r in run.records:
        assert r.send_slip_us is not None and r.send_slip_us >= 0
        assert r.done_offset_us is not None and r.done_offset_us >= r.send_slip_us + SERVICE_US
        assert r.queued_us is None
    slips = sorted(r.send_slip_us for r in run.records)  # type: ignore[type-var]
    assert slips[n // 2] < 10_000, slips
    check_workers(run, [15, 15])


def test_open_loop_cap_is_split_over_the_workers(queue: str) -> None:
    """Arrivals every 2 ms at a server that takes 5 ms, at most 2 in flight over 2 workers:
    never more than 2 at once, and the held-back requests slip."""
    n = 16
    plan = OpenLoop.of(ArrivalProcess("constant", 500), n, max_in_flight=2)
    run = run_point(wl(queue), ["p"] * n, plan, "k", workers=4)
    assert len(run.workers) == 2  # no more workers than the cap
    assert [r.request_id for r in run.records] == ids("k", n) and all(r.ok for r in run.records)
    assert in_flight_max(run.records) <= 2
    assert max(r.send_slip_us for r in run.records) > 2 * SERVICE_US  # type: ignore[type-var]


def test_open_loop_deal_is_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker k gets requests k, k + N, ... with their own prompts and send times."""
    got: list[Share] = []

    def capture(shares: list[Share], out: PointRun) -> PointRun:
        got.extend(shares)
        return out

    monkeypatch.setattr(workers_mod, "_run", capture)
    plan = OpenLoop(tuple(range(0, 70, 10)), max_in_flight=5)
    prompts = [f"p{i}" for i in range(7)]
    run_point(wl("http://127.0.0.1:9"), prompts, plan, "d", workers=3)
    assert [(s.indices, s.prompts, s.offsets_ns, s.slots, s.counter) for s in got] == [
        ((0, 3, 6), ("p0", "p3", "p6"), (0, 30, 60), 2, ""),
        ((1, 4), ("p1", "p4"), (10, 40), 2, ""),
        ((2, 5), ("p2", "p5"), (20, 50), 1, ""),
    ]
    got.clear()
    run_point(wl("http://127.0.0.1:9"), prompts, 5, "d", workers=3)
    assert [(s.slots, s.prompts, s.indices) for s in got] == [(2, tuple(prompts), ())] * 2 + [
        (1, tuple(prompts), ())
    ]
    assert got[0].counter and len({s.counter for s in got}) == 1


def test_shared_count_hands_out_each_index_once(tmp_path: Path) -> None:
    """Two opens of the count (as two workers hold it) take turns: each index once, in order."""
    path = tmp_path / "count"
    path.write_bytes(bytes(8))
    a, b = SharedCount(str(path)), SharedCount(str(path))
    prompts = [f"p{i}" for i in range(5)]
    ta, tb = a.todo(prompts), b.todo(prompts)
    taken = [next(ta), next(tb), next(tb), next(ta), next(ta)]
    assert taken == [(i, f"p{i}") for i in range(5)]
    assert list(ta) == [] and list(tb) == []


def test_refused_connections_are_failed_requests_in_every_worker() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = run_point(wl(f"http://127.0.0.1:{port}"), ["p"] * 7, 4, "x", workers=2)
    assert [r.request_id for r in run.records] == ids("x", 7)
    for r in run.records:
        assert not r.ok and r.error is not None
        assert r.error.startswith(f"Connect to 127.0.0.1:{port} failed")
    # (a refusal is instant: one worker may take every request before the other starts)
    assert [len(run.workers), sum(x["requests"] for x in run.workers)] == [2, 7]


@pytest.mark.parametrize(
    ("workers", "marks", "match"),
    [
        (0, None, r"^workers 0: give a whole number from 1 up$"),
        (True, None, r"^workers True: give a whole number from 1 up$"),
        ("2", None, r"^workers '2': give a whole number from 1 up$"),
        (2, object(), r"^request marks are made in this process: give workers=1 with marks$"),
    ],
)
def test_invalid_worker_counts(workers: object, marks: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        worker_count(workers, marks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        run_point(wl("http://127.0.0.1:9"), ["p"], 1, "x", workers=workers, marks=marks)  # type: ignore[arg-type]


def taken(queue: str) -> int:
    """How many requests the queue server has taken in (tests/queue_server.py GET /taken)."""
    with urllib.request.urlopen(f"{queue}/taken", timeout=10) as resp:
        return int(resp.read())


STOP_SCRIPT = """
import sys
from servelab.design.arrivals import ArrivalProcess
from servelab.client import OpenLoop, PointRun, RequestSettings, run_point
from servelab.launch.server import raise_on_signals
raise_on_signals()
w = RequestSettings(base_url=sys.argv[1], model="m", max_tokens=1, request_timeout_s=30)
out = PointRun()
n = 400
print("started", flush=True)
try:
    if sys.argv[2] == "closed":
        run_point(w, ["p"] * n, 2, "x", out, workers=2)
    else:
        plan = OpenLoop.of(ArrivalProcess("constant", 100), n)
        run_point(w, ["p"] * n, plan, "x", out, workers=2)
except KeyboardInterrupt as exc:
    recs = out.records
    print("interrupted", exc, len(recs), len({r.request_id for r in recs}),
          all(r.ok for r in recs), [r.request_id for r in recs] == sorted(r.request_id for r in recs),
          len(out.workers), sum(x["requests"] for x in out.workers), flush=True)
    sys.exit(3)
print("completed", len(out.records), flush=True)
"""


@pytest.mark.parametrize("kind", ["closed", "open"])
def test_a_stopped_point_keeps_what_the_workers_finished(queue: str, kind: str) -> None:
    """SIGTERM to the process running a 2-worker point (as snakemake stops a job): the point
    ends with KeyboardInterrupt, and `out` holds every request that finished, once each, with
    both workers' entries."""
    before = taken(queue)
    proc = subprocess.Popen(
        [sys.executable, "-c", STOP_SCRIPT, queue, kind], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    # the workers started and the queue took in some of the 400 requests (about 0.5 s on an
    # idle host; a busy one takes longer to start the workers, so no fixed wait)
    deadline = time.monotonic() + 60
    while taken(queue) < before + 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out
    words = out.split()
    assert words[:3] == ["interrupted", "signal", str(int(signal.SIGTERM))], out
    finished, unique = int(words[3]), int(words[4])
    assert 1 <= finished < 400 and unique == finished, out
    assert words[5:8] == ["True", "True", "2"] and int(words[8]) == finished, out
