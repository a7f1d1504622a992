"""Points sent in slices that alternate between two servers (sweep.repeats.slices): the order
A B B A A B ..., each point's windows kept and its metrics over them alone, a pair cut short
kept as incomplete on both sides, the other server's CPU read as known rather than as
contention, and the config's refusals."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from sse_servers import serve_app
from test_rounds import experiment
from test_telemetry_gpus import fake_point_job
from test_validity import BUSY, DEFAULTS, by_check, rec

from servelab.analysis.validity import FAILED, PASSED, check_point
from servelab.client import RequestSettings
from servelab.config import validate
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.errors import ServelabError
from servelab.measure import alternate as alt
from servelab.measure.point import PointJob
from servelab.metrics import in_flight, point_duration, point_metrics, sliced
from servelab.store.request import RequestRecord
from servelab.telemetry.sources import Beside, HostSource

TOKENS = 3


async def stream(request: web.Request) -> web.StreamResponse:
    """A completion of TOKENS tokens, 10 ms apart."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(TOKENS):
        await asyncio.sleep(0.01)
        chunk = {"choices": [{"text": f"t{i}"}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": TOKENS}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return resp


@pytest.fixture(scope="module")
def two_servers() -> Iterator[str]:
    """One SSE server with a path per side (/a, /b), standing in for two servers."""
    app = web.Application()
    for side in ("a", "b"):
        app.router.add_post(f"/{side}/v1/completions", stream)
    yield from serve_app(app)


def side(tmp_path: Path, base: str, sc: str, waves: int = 4) -> PointJob:
    """fake_point_job's PointJob as side `sc` (its server the /<sc> path), `waves` a point, its
    points under tmp_path/exp."""
    job = fake_point_job(tmp_path, None)
    workload = SimpleNamespace(**{**vars(job.workload), "waves": waves, "output_tokens": TOKENS})
    client = RequestSettings(base_url=f"{base}/{sc}", model="m", max_tokens=TOKENS)
    return replace(job, sc=sc, client=client, workload=workload, prompts=["p"] * 64)


SLOT = Slot(repeat=1, level=Level.at_concurrency(2), position=0, run_index=0)


def test_slices_alternate_a_b_b_a_and_each_point_is_measured_over_its_own(
    tmp_path: Path, two_servers: str
) -> None:
    a, b = side(tmp_path, two_servers, "a"), side(tmp_path, two_servers, "b")
    points = [a.open(SLOT, 0), b.open(SLOT, 0)]
    docs = alt.alternate(points, 4, "1/1")
    assert [len(p.slices) for p in points] == [4, 4]
    # every slice in time order, by side: A B B A A B B A
    when = sorted((s[0], p.job.sc) for p in points for s in p.slices)
    assert "".join(sc for _, sc in when) == "abbaabba"
    for p, doc in zip(points, docs, strict=True):
        assert doc["status"] == "complete" and doc["num_prompts"] == 8  # 2 x 4 waves
        on_disk = json.loads((p.final / "point.json").read_text())
        assert on_disk["slices"] == p.slices
        recs = p.run.records
        span = (on_disk["finished_epoch_ns"] - on_disk["started_epoch_ns"]) / 1e9
        # the other side's slices are left out: its duration is well under its span ...
        assert doc["duration"] == pytest.approx(point_duration(recs, p.slices))
        assert doc["duration"] < 0.8 * span
        # ... and its concurrency is that of its own windows, not halved by the gaps
        whole, by_slice = in_flight(recs)[1], in_flight(recs, p.slices)[1]
        assert whole is not None and by_slice is not None and by_slice > 1.4 * whole
        # the analysis reads the same throughput from the requests and the slices
        again = point_metrics(recs, on_disk["slices"])
        assert again["output_throughput"] == pytest.approx(doc["output_throughput"])
        assert len({r.request_id for r in recs}) == 8


def test_a_pair_cut_short_keeps_both_points_as_incomplete(
    tmp_path: Path, two_servers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = side(tmp_path, two_servers, "a"), side(tmp_path, two_servers, "b")
    points = [a.open(SLOT, 0), b.open(SLOT, 0)]
    calls = {"n": 0}
    send = type(points[0]).send

    def stop_on_third(self: Any, part: Any = None) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # B's second slice
            raise KeyboardInterrupt
        send(self, part)

    monkeypatch.setattr(type(points[0]), "send", stop_on_third)
    with pytest.raises(KeyboardInterrupt):
        alt.alternate(points, 4, "1/1")
    for sc, n in (("a", 2), ("b", 2)):
        kept = tmp_path / "exp" / "raw" / sc / "rep01" / "c0002.incomplete" / "point.json"
        doc = json.loads(kept.read_text())
        assert doc["status"] == "incomplete" and doc["num_prompts"] == n
        assert len(doc["slices"]) == 1


def test_bounds_split_a_point_evenly_and_skip_empty_parts() -> None:
    assert alt.bounds(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert alt.bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert alt.bounds(2, 4) == [(0, 1), (1, 2)]


def test_a_request_belongs_to_the_slice_it_was_sent_in() -> None:
    def at(ms: int) -> RequestRecord:
        return RequestRecord(
            request_id=f"r{ms}",
            sent_epoch_ns=ms * 1_000_000,
            ok=True,
            chunk_offsets_us=[1000],
            done_offset_us=10_000,
            output_tokens=1,
        )

    recs = [at(0), at(5), at(100), at(105), at(-3)]
    slices = [[0, 20_000_000], [100_000_000, 120_000_000]]
    parts = sliced(recs, slices)
    assert [[r.request_id for r in p] for p in parts] == [["r0", "r5", "r-3"], ["r100", "r105"]]
    # each slice from its first send to its last end: 18 ms and 15 ms, not the 115 ms span
    assert point_duration(recs, slices) == pytest.approx(0.033)
    assert point_duration(recs) == pytest.approx(0.118)
    assert sliced(recs, None) == [recs]


def test_the_other_servers_cpu_is_known_not_contention() -> None:
    """A sliced point's telemetry spans the other side's slices: its server's CPU is the
    sibling's, read as known, so the point passes where the same host load unexplained fails."""
    recs = [rec(i, list(range(1000, 1_400_000, 20_000))) for i in range(4)]
    assert by_check(check_point(recs, {"telemetry": BUSY}, DEFAULTS))["contention"].status == FAILED
    with_sibling = copy.deepcopy(BUSY)
    with_sibling["cpu"]["siblings_cpu_pct"] = {"mean": 70.0, "p95": 90.0, "max": 95.0}
    f = by_check(check_point(recs, {"telemetry": with_sibling}, DEFAULTS))["contention"]
    assert f.status == PASSED and f.value == pytest.approx(0.06)
    assert f.reason.startswith("0.06 CPU cores busy outside the servers, client and samplers")


def test_host_source_samples_a_siblings_cpu() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        src = HostSource(None, lambda: 0.0, Beside(siblings=(busy.pid,)))
        assert src.open() is None
        first = src.read()[0]
        time.sleep(0.3)
        second = src.read()[0]
        assert second["siblings_cpu_s"] > first["siblings_cpu_s"]
        assert second["siblings_cpu_pct"] > 20.0
        assert "siblings_cpu_s" not in HostSource(None, lambda: 0.0).read()[0]
    finally:
        busy.kill()
        busy.wait()


def test_slices_are_refused_where_they_cannot_alternate() -> None:
    """Without side_by_side, with more slices than waves, and for a rate sweep: one line
    naming the key and what to set."""
    base = experiment(Path("/tmp/unused"), [], interleave=True, side_by_side=True).to_dict()

    def with_(repeats: dict[str, Any], **more: Any) -> dict[str, Any]:
        plan = {"min": 3, "max": 5, "interleave": True, **repeats}
        return {**base, **more, "sweep": {**base["sweep"], "repeats": plan}}

    waves = base["workload"]["waves"]
    cases = [
        (with_({"slices": 2}), "set sweep.repeats.side_by_side: true"),
        (with_({"side_by_side": True, "slices": waves + 1}), f"at most {waves}"),
    ]
    rate = with_({"side_by_side": True, "slices": 2})
    rate["sweep"] = {**rate["sweep"], "rate": [1.0]}
    rate["sweep"].pop("concurrency", None)
    cases.append((rate, "a rate's arrival schedule is sent whole"))
    for cfg, said in cases:
        with pytest.raises(ServelabError, match=said) as e:
            validate(cfg)
        assert "\n" not in str(e.value) and "sweep.repeats.slices" in str(e.value)
    validate(with_({"side_by_side": True, "slices": waves}))  # as many as waves: fine


def test_a_side_by_side_round_sends_each_level_pair_in_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With sweep.repeats.slices, each level's pair of points goes to `alternate` together,
    in the level's turn (a b, then b a), each point opened beside the other's server."""
    from experiment_fixtures import measure_job
    from test_rounds import CLEAR, NULL
    from test_side_by_side import FakeLive, stub_side_by_side
    from test_summary_rounds import Clock

    from servelab.measure import sequential as rounds_mod

    clock = Clock()
    order, _ = stub_side_by_side(monkeypatch, clock)
    pids = {"a": 101, "b": 202}
    opened: list[tuple[str, int, int, tuple[int, ...]]] = []

    def open_(live: Any, slot: Slot, siblings: tuple[int, ...]) -> Any:
        opened.append((live.job.sc, slot.repeat, int(slot.level.value), siblings))
        return (live, slot)

    def alternate(points: list[Any], slices: int, progress: str) -> None:
        assert slices == 4 and len(points) == 2
        for live, slot in points:
            live.measure(slot, progress)

    monkeypatch.setattr(FakeLive, "open", open_, raising=False)
    monkeypatch.setattr(FakeLive, "pid", lambda live: pids[live.job.sc], raising=False)
    monkeypatch.setattr(rounds_mod, "alternate", alternate)
    exp = experiment(tmp_path, [CLEAR, NULL], interleave=True, side_by_side=True, slices=4)
    rounds_mod.run_rounds(measure_job(exp, tmp_path / "seq", model_dir=tmp_path))
    assert len(opened) == len(order) and opened
    pairs = [(opened[i], opened[i + 1]) for i in range(0, len(opened), 2)]
    for x, y in pairs:  # one level of one round, each side beside the other's server
        assert x[1:3] == y[1:3] and {x[0], y[0]} == {"a", "b"}
        assert x[3] == (pids[y[0]],) and y[3] == (pids[x[0]],)
    assert [x[0] for x, _ in pairs][:4] == ["a", "b", "b", "a"]


def test_a_server_that_died_during_a_pair_keeps_both_points_as_incomplete(
    tmp_path: Path, two_servers: str
) -> None:
    a, b = side(tmp_path, two_servers, "a"), side(tmp_path, two_servers, "b")
    dead = SimpleNamespace(
        telemetry_process=lambda: None,
        alive_after=lambda records: False,
        gone_text=lambda: "exited with code 1",
        log_path=tmp_path / "a.log",
        log_tail=lambda: "",
    )
    a = replace(a, session=SimpleNamespace(server=dead))  # type: ignore[arg-type]
    with pytest.raises(ServelabError, match="the server exited with code 1 during point"):
        alt.alternate([a.open(SLOT, 0), b.open(SLOT, 0)], 2, "1/1")
    for sc in ("a", "b"):
        rep = tmp_path / "exp" / "raw" / sc / "rep01"
        doc = json.loads((rep / "c0002.incomplete" / "point.json").read_text())
        assert doc["status"] == "incomplete" and len(doc["slices"]) == 2
        assert not (rep / "c0002.partial").exists() and not (rep / "c0002").exists()
