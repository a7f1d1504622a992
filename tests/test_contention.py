"""The contention check on the real CPU sampler: a busy process started during a point is
flagged, also when the point is shorter than one sampling period (the default 4 Hz), which no
sample falls inside. The check's arithmetic on recorded blocks is tests/test_validity.py's."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.analysis.validity.catalog import check_point
from servelab.analysis.validity.flags import FAILED
from servelab.config import default_section
from servelab.experiment import TelemetrySection, ValiditySection
from servelab.telemetry import PointTelemetry

DEFAULTS = default_section(ValiditySection, "analysis", "validity")
SETTINGS = default_section(TelemetrySection, "telemetry")  # cpu_hz 4: a sample every 0.25 s
SPIN = "import sys, time\nprint('spinning', flush=True)\nwhile True: pass\n"


@pytest.fixture
def idle_server() -> Iterator[int]:
    """A process standing in for the server: it takes no CPU, so everything busy on the host
    but the test's own process is "outside the server"."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def point_beside_a_busy_process(server_pid: int, seconds: float, tmp: Path) -> dict:
    """One point of `seconds` (the client waits, as one waiting on a slow server), with one
    core kept busy from before the sample that opens it until after the one that closes it.
    Returns point.json's `telemetry` block."""
    busy = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline().strip() == "spinning"
        tel = PointTelemetry(SETTINGS, server_pid, None)
        with tel:
            time.sleep(0.05)
            started = time.time_ns()
            time.sleep(seconds)
            finished = time.time_ns()
        return dict(tel.finish(tmp, started, finished))
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.parametrize("seconds", [0.1, 1.0], ids=["shorter-than-a-sample", "a-second"])
def test_a_busy_process_during_a_point_is_contention(
    idle_server: int, tmp_path: Path, seconds: float
) -> None:
    telemetry = point_beside_a_busy_process(idle_server, seconds, tmp_path)
    cpu = telemetry["cpu"]
    inside = cpu["samples"]
    if seconds < 1 / SETTINGS.cpu_hz:
        assert inside <= 1  # what the check once had to go on: at most one sample, often none
    assert cpu["host_cpu_pct"]["mean"] is not None
    flags = {f.check: f for f in check_point([], {"telemetry": telemetry}, DEFAULTS)}
    f = flags["contention"]
    # one core spinning outside the server, the client and the samplers: about 1.0 on an
    # otherwise quiet host, more where other work runs beside this test
    assert f.status == FAILED, f
    assert f.value is not None and f.value > 0.5, f
    assert "CPU cores busy outside the server" in f.reason
