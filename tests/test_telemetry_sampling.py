"""The sampler threads: start and stop cleanly, bracket the point, survive failing sources."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from telemetry_fakes import metrics_server

from servelab.config import default_section
from servelab.experiment import TelemetrySection
from servelab.telemetry import PointTelemetry, read_samples
from servelab.telemetry.sampling import Sampler
from servelab.telemetry.sources import HostSource

FAST = TelemetrySection(enabled=True, gpu_hz=20, cpu_hz=20, metrics_hz=10, metrics_timeout_s=1)


class CountingSource:
    name = "cpu"

    def __init__(self, fail_every: int = 0) -> None:
        self.n = 0
        self.fail_every = fail_every

    def open(self) -> str | None:
        return None

    def read(self) -> list[dict[str, Any]]:
        self.n += 1
        if self.fail_every and self.n % self.fail_every == 0:
            raise RuntimeError("flaky")
        return [{"source": "cpu", "epoch_ns": time.time_ns(), "n": self.n}]

    def close(self) -> None:
        pass


def telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("servelab-telemetry")]


def test_sampler_brackets_and_stops() -> None:
    s = Sampler(CountingSource(), hz=50)
    s.start()
    assert s.first.wait(5)
    started = time.time_ns()
    assert s.samples and s.samples[0]["epoch_ns"] <= started  # a sample before the point
    time.sleep(0.2)
    stopped = time.time_ns()
    assert s.stop(5)
    assert not s._thread.is_alive()
    assert s.samples[-1]["epoch_ns"] >= stopped  # and one after it
    assert 3 <= len(s.samples) <= 20  # about 50 Hz for 0.2 s, never bunched
    assert s.cpu_s > 0


def test_a_failing_read_is_an_error_record_and_the_sampler_goes_on() -> None:
    s = Sampler(CountingSource(fail_every=2), hz=100)
    s.start()
    time.sleep(0.1)
    assert s.stop(5)
    errors = [r for r in s.samples if "error" in r]
    assert errors and errors[0]["error"] == "RuntimeError: flaky"
    assert len(s.samples) - len(errors) >= 2


def test_default_settings_come_from_the_schema() -> None:
    d = default_section(TelemetrySection, "telemetry")
    assert d == TelemetrySection(
        enabled=True, gpu_hz=10, cpu_hz=4, metrics_hz=2, metrics_timeout_s=2
    )


@pytest.fixture
def server_tree() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in server in its own session: a process with a child, both burning a little CPU."""
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', "
        "'import time\\nwhile True: sum(range(10000)); time.sleep(0.001)'])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    # until the child exists: on a busy host two interpreter starts can take well over 0.5 s
    deadline = time.monotonic() + 30.0
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(proc.pid).children(), "the stand-in server's child never started"
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: no child outlives the test
    proc.wait()


def _scrape(row: dict) -> bool:
    """A /metrics sample that read the server (not an error)."""
    return row["source"] == "server" and not row.get("error")


def test_point_telemetry_writes_every_source(
    tmp_path: Path, server_tree: subprocess.Popen[bytes]
) -> None:
    with metrics_server() as url:
        tel = PointTelemetry(FAST, server_tree.pid, url)
        with tel:
            assert len(telemetry_threads()) >= 2
            t0 = time.time_ns()
            # at least 0.5 s, and until two scrapes fall inside the window: on a host busy with
            # other tests (a real server beside this worker) a 10 Hz scraper can be starved
            deadline = time.monotonic() + 10.0
            while time.time_ns() - t0 < 500_000_000 or (
                sum(1 for r in tel.samples() if _scrape(r) and r["epoch_ns"] > t0) < 2
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            t1 = time.time_ns()
        assert telemetry_threads() == []
        summary = tel.finish(tmp_path, t0, t1)
    rows = read_samples(tmp_path / "telemetry.jsonl")
    assert rows == sorted(rows, key=lambda r: r["epoch_ns"])
    assert {r["source"] for r in rows} == {"gpu", "cpu", "server", "rapl"}
    for r in rows:
        assert isinstance(r["epoch_ns"], int)
    cpu = [r for r in rows if r["source"] == "cpu"]
    assert min(r["epoch_ns"] for r in cpu) <= t0 and max(r["epoch_ns"] for r in cpu) >= t1
    assert all(r["server_procs"] == 2 for r in cpu)  # the server and its child
    assert summary["cpu"]["server_cpu_s"] > 0 and summary["cpu"]["server_cpu_pct"]["max"] > 0
    assert summary["server"]["samples"] >= 2 and summary["server"]["generation_tokens"] == 0.0
    assert summary["server"]["running"]["max"] == 0.0
    text = (tmp_path / "telemetry.jsonl").read_text()
    assert text.endswith("\n") and '"source": "server"' in text


def test_a_point_cut_short_keeps_what_was_sampled(tmp_path: Path) -> None:
    tel = PointTelemetry(FAST, None, None)
    t0 = time.time_ns()
    with pytest.raises(KeyboardInterrupt), tel:
        time.sleep(0.2)
        raise KeyboardInterrupt
    assert telemetry_threads() == []
    summary = tel.finish(tmp_path, t0, time.time_ns())
    assert len([r for r in read_samples(tmp_path / "telemetry.jsonl") if r["source"] == "cpu"]) >= 3
    assert summary["server"] == {"absent": "no server URL given"}


def test_interrupted_while_starting_the_samplers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C can arrive after the samplers exist and before their threads start: finishing
    must still write what there is (the point is then kept as incomplete), not fail on a
    thread that never started."""
    from servelab.telemetry import sampling

    def interrupted(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sampling.Sampler, "start", interrupted)
    tel = PointTelemetry(FAST, None, None)
    t0 = time.time_ns()
    with pytest.raises(KeyboardInterrupt), tel:
        pass
    summary = tel.finish(tmp_path, t0, time.time_ns())
    assert (tmp_path / "telemetry.jsonl").exists()
    assert summary["server"] == {"absent": "no server URL given"}


def test_disabled_telemetry_samples_nothing(tmp_path: Path) -> None:
    tel = PointTelemetry(replace(FAST, enabled=False), None, None)
    with tel:
        assert telemetry_threads() == []
    assert tel.finish(tmp_path, 0, 1) == {"enabled": False}
    assert not (tmp_path / "telemetry.jsonl").exists()


def test_a_server_that_is_gone_is_said_and_the_client_still_sampled() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    src = HostSource(proc.pid, lambda: 0.0)
    assert src.open() is None
    a, b = src.read()[0], (time.sleep(0.05), src.read()[0])[1]
    assert a["server_error"] == f"server process {proc.pid} is gone"
    assert a["server_cpu_s"] is None and b["client_cpu_s"] is not None
    assert b["client_cpu_pct"] is not None and b["host_cpu_pct"] is not None


def test_client_cpu_never_steps_back() -> None:
    """psutil counts the client in 10 ms ticks, the samplers' own CPU in ns: between two ticks
    their difference falls; the cumulative client counter must not (a point's CPU is the
    difference of two samples and was once negative)."""
    own = iter(i * 0.002 for i in range(1000))
    src = HostSource(None, lambda: next(own))
    src.open()
    values = []
    for _ in range(40):
        t_end = time.process_time() + 0.004  # the client works; psutil sees it in ticks
        while time.process_time() < t_end:
            pass
        values.append(src.read()[0]["client_cpu_s"])
    assert values == sorted(values)
    assert values[-1] > 0


def test_host_steal_is_recorded_from_cpu_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steal as % of all cores over the interval, over the same total as the busy %, which
    counts it as busy; null on the first sample and where cpu_times has no `steal` field."""
    from collections import namedtuple

    import psutil

    linux = namedtuple("linux", "user system idle iowait steal")
    ticks = iter(
        [
            linux(100.0, 50.0, 800.0, 10.0, 40.0),
            linux(130.0, 60.0, 840.0, 10.0, 60.0),  # 100 s: 20 steal, 40 idle -> 60% busy
            linux(130.0, 60.0, 940.0, 10.0, 60.0),  # 100 s idle: no steal
        ]
    )
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(ticks))
    src = HostSource(None, lambda: 0.0)
    assert src.open() is None
    first, second, third = (src.read()[0] for _ in range(3))
    assert first["host_steal_pct"] is None
    assert second["host_steal_pct"] == pytest.approx(20.0)
    assert second["host_cpu_pct"] == pytest.approx(60.0)
    assert third["host_steal_pct"] == 0.0 and third["host_cpu_pct"] == 0.0

    darwin = namedtuple("darwin", "user nice system idle")
    mac = iter([darwin(10.0, 0.0, 5.0, 85.0), darwin(20.0, 0.0, 10.0, 170.0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(mac))
    src = HostSource(None, lambda: 0.0)
    assert src.open() is None
    a, b = src.read()[0], src.read()[0]
    assert a["host_steal_pct"] is None and b["host_steal_pct"] is None
    assert b["host_cpu_pct"] == pytest.approx(15.0)
