"""The benchmarks' SSE fixtures: sse_fixture.c is a twin of sse_fixture.py (same responses, same
truth at /sends), and --chunk-tokens puts that many events, each stamped, in one write."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servelab.launch.ports import free_port

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build benchmarks/sse_fixture.c")
    out = tmp_path_factory.mktemp("fixture") / "sse_fixture_c"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", str(out), str(BENCH / "sse_fixture.c")],
                   check=True)  # fmt: skip
    return out


def _start(cmd: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    p = subprocess.Popen([*cmd, "--port", str(port), "--step-us", "2000", "--chunk-tokens", "3"])
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            assert c.getresponse().read() == b"{}"
            return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise AssertionError(f"fixture {cmd} did not start")


@pytest.fixture(params=["py", "c"])
def fixture(request: pytest.FixtureRequest, c_binary: Path) -> Iterator[int]:
    cmd = (
        [sys.executable, str(BENCH / "sse_fixture.py")]
        if request.param == "py"
        else [str(c_binary)]
    )
    p, port = _start(cmd)
    yield port
    p.terminate()
    p.wait()


def _raw_stream(port: int, rid: str, max_tokens: int) -> bytes:
    """The response's raw chunked body, every sent_ns replaced by 0."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"model": "fixture", "prompt": "x", "max_tokens": max_tokens, "stream": True})
    c.request("POST", "/v1/completions", body=body,
              headers={"Content-Type": "application/json", "X-Request-Id": rid})  # fmt: skip
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    data = r.read()
    c.close()
    return re.sub(rb'"sent_ns":\d+', b'"sent_ns":0', data)


def _sends(port: int) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/sends")
    out: dict[str, Any] = json.loads(c.getresponse().read())
    return out


def test_the_c_fixture_answers_exactly_as_the_python_one(c_binary: Path) -> None:
    streams = {}
    for name, cmd in (("py", [sys.executable, str(BENCH / "sse_fixture.py")]),
                      ("c", [str(c_binary)])):  # fmt: skip
        p, port = _start(cmd)
        try:
            streams[name] = _raw_stream(port, "req-1", 7)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/nowhere")
            assert c.getresponse().status == 404
        finally:
            p.terminate()
            p.wait()
    assert streams["py"] == streams["c"]
    # 7 tokens in writes of 3, 3 and 1: three chunks, the last with the usage and [DONE]
    events = [e for e in streams["c"].split(b"\n\n") if b"data: " in e]
    assert sum(b'"text":" tok"' in e for e in events) == 7
    assert events[-1].endswith(b"data: [DONE]")
    assert b'"completion_tokens":7' in streams["c"]


def test_sends_keep_each_tokens_send_time_and_are_served_once(fixture: int) -> None:
    t0 = time.time_ns()
    raw = _raw_stream(fixture, "r-a", 5)
    _raw_stream(fixture, "r-b", 2)
    sends = _sends(fixture)
    assert set(sends) == {"r-a", "r-b"}
    a = sends["r-a"]
    assert len(a["sends"]) == 5 and len(sends["r-b"]["sends"]) == 2
    assert t0 <= a["recv_ns"] <= a["sends"][0]
    assert a["sends"] == sorted(a["sends"])
    # tokens written together share their send time; writes are a step (2 ms) apart or more
    assert a["sends"][0] == a["sends"][1] == a["sends"][2] and a["sends"][3] == a["sends"][4]
    assert a["sends"][3] - a["sends"][2] >= 1_500_000
    assert raw.count(b'"finish_reason":"length"') == 1
    assert _sends(fixture) == {}  # served once, then forgotten
