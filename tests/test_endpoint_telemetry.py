"""The telemetry of a server servelab did not launch (runtime.kind endpoint): local or remote
by its URL's host; a local one's CPU from the process listening on its port, a remote one's
absent with the reason, and the contention check not checked for it."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from telemetry_fakes import FakeNVML, device, fake_powercap

from servelab.analysis.validity.facts import PointFacts
from servelab.analysis.validity.flags import NOT_CHECKED, PASSED
from servelab.analysis.validity.measurement import check_contention
from servelab.config import default_section
from servelab.env import endpoint
from servelab.experiment import TelemetrySection, ValiditySection
from servelab.telemetry import PointTelemetry, server_gpus
from servelab.telemetry.sampling import HostAccess

FAST = TelemetrySection(enabled=True, gpu_hz=50, cpu_hz=50, metrics_hz=1, metrics_timeout_s=1)


def test_loopback_names_and_this_host_s_addresses_are_local() -> None:
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert endpoint.is_local_host(host), host
    assert endpoint.is_local_host("10.1.2.3", own={"10.1.2.3"})
    assert not endpoint.is_local_host("10.1.2.3", own={"10.9.9.9"})
    assert not endpoint.is_local_host("192.0.2.7", own=set())  # TEST-NET-1: another host
    assert not endpoint.is_local_host("no-such-host.invalid", own=set())


def test_an_address_of_this_host_is_local_by_its_interfaces() -> None:
    import psutil

    addrs = [
        a.address
        for nics in psutil.net_if_addrs().values()
        for a in nics
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    for addr in addrs[:1]:
        assert endpoint.is_local_host(addr)


def test_a_remote_url_s_server_process_is_the_reason() -> None:
    assert endpoint.server_process("http://192.0.2.7:8000") == endpoint.REMOTE
    assert endpoint.REMOTE.startswith("remote endpoint")


def test_a_local_url_s_server_process_is_the_one_listening_on_its_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert endpoint.listening_pid(port) == os.getpid()
        assert endpoint.server_process(f"http://127.0.0.1:{port}") == os.getpid()
        assert endpoint.server_process(f"http://localhost:{port}") == os.getpid()
    reason = endpoint.server_process(f"http://127.0.0.1:{port}")
    assert isinstance(reason, str) and f"no process this user can see listens on port {port}" in (
        reason
    )


def _sampled(tmp_path: Path, server: int | str | None) -> dict[str, Any]:
    root = fake_powercap(tmp_path / "pc", {0: 0})
    tel = PointTelemetry(
        FAST,
        server,
        None,
        host=HostAccess(FakeNVML([device()]), root),
        gpus=server_gpus("gpu", None, {}, {}),
    )
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    return tel.finish(tmp_path / "p", t0, t1, output_tokens=10)


def test_a_remote_server_s_cpu_gpus_and_energy_are_absent_with_the_reason(
    tmp_path: Path,
) -> None:
    summary = _sampled(tmp_path, endpoint.REMOTE)
    assert summary["cpu"]["server_error"] == endpoint.REMOTE
    assert summary["cpu"]["server_cpu_pct"]["mean"] is None
    assert summary["cpu"]["client_cpu_pct"]["mean"] is not None  # the client is this host's
    # this host's GPUs and CPU packages are not the server's
    assert summary["gpu"] == {"absent": endpoint.REMOTE}
    assert summary["rapl"] == {"absent": endpoint.REMOTE}
    assert summary["energy"]["joules"] is None and summary["energy"]["absent"] == endpoint.REMOTE


def test_a_local_server_s_hardware_is_sampled(tmp_path: Path) -> None:
    summary = _sampled(tmp_path, os.getpid())
    assert summary["cpu"]["server_error"] is None
    assert summary["cpu"]["server_cpu_pct"]["mean"] is not None
    assert "absent" not in summary["gpu"] and "absent" not in summary["rapl"]


def _facts(cpu: dict[str, Any]) -> PointFacts:
    return PointFacts(requests=(), duration_s=2.0, telemetry={"enabled": True, "cpu": cpu})


def test_the_contention_check_is_not_checked_for_a_remote_server() -> None:
    t = default_section(ValiditySection, "analysis", "validity")
    mean = {"mean": 50.0}
    remote = {
        "host_cpus": 2,
        "host_cpu_pct": {"mean": 90.0},  # busy: would fail if it were the server's host
        "server_cpu_pct": {"mean": None},
        "client_cpu_pct": mean,
        "telemetry_cpu_pct": {"mean": 1.0},
        "server_error": endpoint.REMOTE,
    }
    flag = check_contention(_facts(remote), t)
    assert (flag.status, flag.value, flag.reason) == (NOT_CHECKED, None, endpoint.REMOTE)
    local = {**remote, "server_cpu_pct": {"mean": 120.0}, "server_error": None}
    local["host_cpu_pct"] = {"mean": 86.0}
    assert check_contention(_facts(local), t).status == PASSED
