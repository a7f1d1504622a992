"""One measuring server per host: the host's measuring-server lock (hostlock.MeasuringLock),
taken by every process that starts a measuring server (session.serve), waited for by the next
one, released when its holder ends, however it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from servelab.errors import ServelabError
from servelab.experiment import ServerSection
from servelab.launch.hostlock import MeasuringLock
from servelab.launch.ports import free_port
from servelab.launch.server import ServerLaunch
from servelab.launch.session import serve
from servelab.store.paths import measuring_lock_path

TESTS = Path(__file__).resolve().parent

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from servelab.launch.hostlock import MeasuringLock
    lock = MeasuringLock(60, lambda s: None, Path(sys.argv[1]))
    lock.acquire()
    print("held", flush=True)
    if sys.argv[2] == "-":  # until told, on stdin
        sys.stdin.readline()
    else:
        time.sleep(float(sys.argv[2]))
    print(f"released {time.time()!r}", flush=True)
    lock.release()
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
    """
)
WAITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from servelab.launch.hostlock import MeasuringLock
    notes = []
    def note(line):
        notes.append(line)
        print("note", flush=True)  # waiting, as the note says
    lock = MeasuringLock(float(sys.argv[2]), note, Path(sys.argv[1]), poll_s=0.1)
    try:
        record = lock.acquire()
    except Exception as exc:
        print(json.dumps({"error": str(exc), "notes": notes}))
        raise SystemExit(3)
    print(json.dumps({"record": record, "notes": notes, "acquired": time.time()}))
    lock.release()
    """
)


def start_holder(path: Path, hold_s: float | str, *extra: str) -> subprocess.Popen[str]:
    """A process that takes the lock, says `held`, keeps it hold_s (or, for "-", until a line
    on its stdin), then releases it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(hold_s), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def start_waiter(path: Path, timeout_s: float) -> subprocess.Popen[str]:
    """A process that waits up to timeout_s for the lock, says `note` at each of the lock's
    notes (the first: it found the lock held), and prints its outcome as JSON last."""
    return subprocess.Popen(
        [sys.executable, "-c", WAITER, str(path), str(timeout_s)], stdout=subprocess.PIPE, text=True
    )


def waiter_outcome(waiter: subprocess.Popen[str]) -> tuple[int, dict[str, object]]:
    out, _ = waiter.communicate(timeout=120)
    return waiter.returncode, json.loads(out.strip().splitlines()[-1])


def run_waiter(path: Path, timeout_s: float) -> tuple[int, dict[str, object]]:
    return waiter_outcome(start_waiter(path, timeout_s))


def test_a_second_process_waits_for_the_first_then_proceeds(tmp_path: Path) -> None:
    """The holder keeps the lock until the waiter has said it waits, and 1.5 s more: on a busy
    host a waiter can take longer to start than any fixed hold."""
    path = tmp_path / "locks" / "measuring-server.lock"
    holder = start_holder(path, "-")
    waiter = start_waiter(path, 60)
    assert waiter.stdout is not None and waiter.stdout.readline().strip() == "note"
    time.sleep(1.5)
    out, _ = holder.communicate("\n", timeout=30)
    released = float(out.split("released ", 1)[1])
    code, got = waiter_outcome(waiter)
    assert code == 0, got
    record = got["record"]
    assert isinstance(record, dict)
    assert record["path"] == str(path)
    assert record["waited_s"] > 1.0
    assert record["holder"]["pid"] == holder.pid
    assert "-c" in record["holder"]["command"] and str(path) in record["holder"]["command"]
    assert record["holder"]["since"]
    notes = got["notes"]
    assert isinstance(notes, list) and notes
    assert f"held by pid {holder.pid} (" in notes[0] and str(path) in notes[0]
    assert "since " in notes[0]
    assert float(got["acquired"]) >= released  # type: ignore[arg-type]
    # released: the file no longer names a holder
    assert path.read_text() == ""


def test_waiting_too_long_fails_with_one_line_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "measuring-server.lock"
    holder = start_holder(path, 60)
    try:
        code, got = run_waiter(path, 1.0)
    finally:
        holder.kill()
        holder.wait()
    assert code == 3
    error = str(got["error"])
    assert "\n" not in error
    assert f"pid {holder.pid} (" in error and "-c" in error
    assert "server.lock_timeout_s 1" in error and "let it finish or stop it" in error


def test_a_holder_killed_outright_leaves_no_lock(tmp_path: Path) -> None:
    path = tmp_path / "measuring-server.lock"
    holder = start_holder(path, 60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    t0 = time.monotonic()
    with MeasuringLock(5, lambda s: None, path) as lock:
        assert lock.record()["holder"] is None
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert time.monotonic() - t0 < 2


def test_a_process_asking_twice_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "measuring-server.lock"
    with MeasuringLock(5, lambda s: None, path):
        t0 = time.monotonic()
        with pytest.raises(ServelabError, match="already holds"):
            MeasuringLock(600, lambda s: None, path).acquire()
        assert time.monotonic() - t0 < 1
    with MeasuringLock(5, lambda s: None, path) as again:  # released: free again
        assert again.record()["waited_s"] < 1


def test_lock_is_per_host_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    monkeypatch.delenv("SERVELAB_LOCK_DIR", raising=False)
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "cache"))
    assert measuring_lock_path() == (
        tmp_path / "cache" / "locks" / platform.node() / "measuring-server.lock"
    )
    monkeypatch.setenv("SERVELAB_LOCK_DIR", str(tmp_path / "elsewhere"))
    assert measuring_lock_path() == tmp_path / "elsewhere" / "measuring-server.lock"


def test_serve_waits_for_another_process_and_records_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve(), as a sweep starts its server (tests/fake_vllm_server.py standing in for vLLM),
    while another process holds the lock: it waits, says so naming that process, starts the
    server once the lock is free and records the wait and the start."""
    monkeypatch.setenv("SERVELAB_LOCK_DIR", str(tmp_path / "locks"))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {TESTS / "fake_vllm_server.py"} "$@"\n')
    python.chmod(0o755)
    launch = ServerLaunch(str(python), str(tmp_path), "m", "127.0.0.1", free_port(), [])
    settings = ServerSection(
        host="127.0.0.1",
        port=0,
        startup_timeout_s=60,
        shutdown_timeout_s=5,
        lock_timeout_s=60,
        engine_nice=0,
        args={},
        configs=(),
    )
    holder = start_holder(measuring_lock_path(), 2.0)
    notes: list[str] = []
    with serve(launch, tmp_path / "server.log", settings, notes.append) as session:
        out, _ = holder.communicate(timeout=30)
        released = float(out.split("released ", 1)[1])
        assert time.time() >= released
        assert session.server.alive()
        lock, start = dict(session.lock), dict(session.start)
    assert lock["waited_s"] > 1.0
    assert lock["holder"]["pid"] == holder.pid
    assert any(f"held by pid {holder.pid}" in n for n in notes)
    assert start["ready_t_s"] is not None and start["ready_t_s"] > 0
    assert [p["phase"] for p in start["phases"]][0] == "import"
    # the server has stopped and the lock is free
    with MeasuringLock(1, lambda s: None) as again:
        assert again.record()["holder"] is None
