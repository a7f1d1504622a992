"""The host's measuring-server lock: one measuring server on a host at a time
(`MeasuringLock`, taken by servelab.launch.session.serve, and by a sweep job around its launch
and its host-speed canary, servelab.measure.sweep)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from servelab.documents.declared import LockRecord, LockRecordHolder
from servelab.errors import ServelabError
from servelab.job import Say
from servelab.store.paths import measuring_lock_path

# this process's lock paths, while it holds them
_HELD: set[str] = set()


def _own_command() -> str:
    """This process's command line, as `ps` shows it."""
    try:
        raw = Path("/proc/self/cmdline").read_bytes()
        args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    except OSError:
        args = [sys.executable, *sys.argv]
    return " ".join(args or sys.argv)


def _holder_text(holder: Mapping[str, object] | None) -> str:
    if not holder:
        return "a process that has not said which (the lock file is empty)"
    command = " ".join(str(holder.get("command") or "?").split())
    if len(command) > 200:
        command = command[:197] + "..."
    return f"pid {holder.get('pid')} ({command}), since {holder.get('since')}"


class MeasuringLock:
    """The host's measuring-server lock: one measuring server on a host at a time.

    Two measurements on one host measure each other (two `snakemake` invocations, or a test run
    beside an experiment). Every process that starts a measuring server, a sweep's launch or the
    profiling pass's, holds this lock from before the server starts until it has stopped
    (`serve` takes it, or is handed it held: a sweep job takes it before its host-speed canary,
    so that the canary before the launch, the server and the canary after it run under one hold,
    with no other measuring server on the host's CPUs or GPUs). It is an flock on `path`
    (paths.measuring_lock_path(): in the servelab cache, per host), so the kernel releases it
    when its process ends, however it ends: a job killed outright leaves no stale lock. The
    holder writes its pid, command line and since when into the file; a process that finds the
    lock taken waits, says so at once and every `note_every_s` naming the holder, and gives up
    after `timeout_s` (server.lock_timeout_s) with one line naming the holder and what to do.

    A process that already holds the lock and asks for it again (a server started while one
    it started still runs) fails at once: it would wait for itself. Another process waits: a
    test session that keeps one server running across tests (a module-scoped fixture) while a
    test starts another in a subprocess (a `snakemake` run) makes that subprocess wait until
    the fixture's server stops, or time out. That is the lock doing its work, not a hang: stop
    the long-lived server first, or let the tests run one measuring server at a time.
    """

    def __init__(
        self,
        timeout_s: float,
        say: Say = print,
        path: Path | None = None,
        *,
        poll_s: float = 0.5,
        note_every_s: float = 15.0,
    ) -> None:
        self.path = path or measuring_lock_path()
        self.timeout_s = timeout_s
        self.say = say
        self.poll_s = poll_s
        self.note_every_s = note_every_s
        self.waited_s = 0.0
        self.holder: dict[str, object] | None = None  # who held it while this process waited
        self._fh: IO[str] | None = None

    @property
    def held(self) -> bool:
        """Whether this lock is taken (acquired and not yet released)."""
        return self._fh is not None

    def holder_info(self) -> dict[str, object] | None:
        """What the holder wrote into the lock file (None when it is empty or unreadable)."""
        try:
            text = self.path.read_text(encoding="utf-8")
            info = json.loads(text) if text.strip() else None
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def acquire(self) -> LockRecord:
        """Wait for the lock (up to timeout_s), take it and write who holds it; the record of
        launch.json's `lock`."""
        key = str(self.path.resolve())
        if key in _HELD:
            raise ServelabError(
                f"this process (pid {os.getpid()}) already holds {self.path}: a measuring "
                "server it started still runs; stop it before starting another"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
        t0 = time.monotonic()
        last_note: float | None = None
        try:
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise ServelabError(
                            f"cannot lock {self.path} ({exc.strerror}); set SERVELAB_LOCK_DIR "
                            "to a folder on a local file system"
                        ) from None
                now = time.monotonic()
                self.holder = self.holder_info() or self.holder
                if now - t0 >= self.timeout_s:
                    raise ServelabError(
                        f"another measuring server runs on this host: "
                        f"{_holder_text(self.holder)} holds {self.path}; gave up after "
                        f"{now - t0:.0f} s (server.lock_timeout_s {self.timeout_s:g}); let it "
                        "finish or stop it, then run again"
                    )
                if last_note is None or now - last_note >= self.note_every_s:
                    self.say(
                        f"server: waiting for the host's measuring-server lock {self.path}, "
                        f"held by {_holder_text(self.holder)} ({now - t0:.0f} s so far, "
                        f"server.lock_timeout_s {self.timeout_s:g})"
                    )
                    last_note = now
                time.sleep(self.poll_s)
        except BaseException:
            fh.close()
            raise
        self.waited_s = time.monotonic() - t0
        now_local = datetime.datetime.now().astimezone()
        info = {
            "pid": os.getpid(),
            "command": _own_command(),
            "since": now_local.isoformat(timespec="seconds"),
            "host": platform.node(),
        }
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(info) + "\n")
        fh.flush()
        self._fh = fh
        _HELD.add(key)
        if self.holder is not None:
            self.say(f"server: measuring-server lock taken after {self.waited_s:.0f} s")
        return self.record()

    def record(self) -> LockRecord:
        """launch.json's `lock`: the lock file, the seconds waited for it and who held it
        while this process waited (null when it was free)."""
        holder: LockRecordHolder | None = None
        if self.holder is not None:  # what the holder wrote (`acquire`): its pid, command, since
            pid, command, since = (self.holder.get(k) for k in ("pid", "command", "since"))
            holder = {
                "pid": pid if isinstance(pid, int) else None,
                "command": command if isinstance(command, str) else None,
                "since": since if isinstance(since, str) else None,
            }
        return {"path": str(self.path), "waited_s": round(self.waited_s, 3), "holder": holder}

    def release(self) -> None:
        fh, self._fh = self._fh, None
        if fh is None:
            return
        _HELD.discard(str(self.path.resolve()))
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
            fh.flush()
        with contextlib.suppress(OSError):
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()

    def __enter__(self) -> MeasuringLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
