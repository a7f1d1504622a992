"""The nsys report of a capture: waiting for it after the capture range ends, finding it after
nsys exits, and exporting it to SQLite.

Under `--capture-range-end=stop` nsys writes the report when the capture range ends, while the
server runs on, and then prints "Generated:" and, on the next line, the report's path. That
line goes to nsys's standard output, which the server log takes through a pipe: nsys is
reported to buffer its output when it is not a terminal, so the line may reach the log only
when nsys exits. So the wait ends at whichever comes first: the line in the log, or the report
file (`*.nsys-rep` in the trace folder) present with a size and a modification time that have
not changed for REPORT_SETTLE_S seconds. After a settled file, as after neither within
profile.report_timeout_s, the caller stops the server with that much more time: nsys finishes
writing the report (or writes it) before it exits, and the export reads it after that.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.documents.declared import NsysReport
from servelab.env.container import ContainerRun
from servelab.errors import ServelabError
from servelab.job import Say
from servelab.launch.server import Server
from servelab.profile.commands import nsys_export_command

# how long a report file's size and modification time must stay unchanged to be taken
REPORT_SETTLE_S = 5.0
POLL_S = 0.5
REPORT_GLOB = "*.nsys-rep"

# nsys prints "Generated:" and, on the next line, the report's path once it has written it
_GENERATED_RE = re.compile(r"Generated:\s+(\S+\.nsys-rep)")


def generated_report(log_path: Path, offset: int = 0) -> Path | None:
    """The last report nsys says it generated in the server log (from byte `offset` on)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    found = _GENERATED_RE.findall(text)
    return Path(found[-1]) if found else None


class SettledFile:
    """The newest report file in a folder, once its size and modification time have stayed
    unchanged for `settle_s` seconds (polled: `check` once per poll)."""

    def __init__(self, folder: Path, settle_s: float) -> None:
        self.folder = folder
        self.settle_s = settle_s
        self._state: tuple[Path, int, int] | None = None
        self._since = 0.0

    def check(self) -> Path | None:
        found = []
        for p in self.folder.glob(REPORT_GLOB):
            try:
                st = p.stat()
            except OSError:  # renamed or removed while listed
                continue
            found.append((st.st_mtime_ns, p, st.st_size))
        if not found:
            self._state = None
            return None
        mtime, path, size = max(found)
        state = (path, size, mtime)
        now = time.monotonic()
        if state != self._state:
            self._state, self._since = state, now
            return None
        return path if size > 0 and now - self._since >= self.settle_s else None


@dataclass(frozen=True)
class ReportWait:
    """The report of one capture: nsys writes it into `trace_dir` (a folder of the profile
    folder `out`, where capture.json's paths are relative to)."""

    trace_dir: Path
    out: Path
    say: Say

    def record(self, path: Path, generated: str, found_by: str, t0: float) -> NsysReport:
        """capture.json's nsys_report: the report, when nsys wrote it (range end: while the
        server ran; exit: when it stopped), how it was found (its "Generated:" line in the
        log, or the settled file) and how long the job waited for it."""
        where = self.trace_dir / path.name if not path.is_absolute() else path
        if not where.is_file():  # the path nsys printed is the same outside (mounted there)
            where = self.trace_dir / path.name
        return {
            "path": where.resolve().relative_to(self.out.resolve()).as_posix(),
            "generated": generated,
            "found_by": found_by,
            "wait_s": round(time.monotonic() - t0, 3),
        }

    def until_written(self, server: Server, log_offset: int, timeout_s: float) -> NsysReport | None:
        """After the capture range ends: the report once nsys says it wrote it ("Generated:"
        in the server log) or once its file has settled, whichever comes first, while nsys
        runs; None when nsys exits first or `timeout_s` passes."""
        t0 = time.monotonic()
        settled = SettledFile(self.trace_dir, REPORT_SETTLE_S)
        while True:
            found = generated_report(server.log_path, log_offset)
            if found is not None and (self.trace_dir / found.name).is_file():
                self.say(f"nsys wrote {found.name} in {time.monotonic() - t0:.1f} s")
                return self.record(found, "range end", "log line", t0)
            done = settled.check()
            if done is not None:
                self.say(
                    f"nsys wrote {done.name}: its size has not changed for "
                    f"{REPORT_SETTLE_S:g} s (no 'Generated:' line in the log yet: nsys's "
                    f"output is buffered), {time.monotonic() - t0:.1f} s after the range ended"
                )
                return self.record(done, "range end", "settled file", t0)
            if not server.alive():
                return None  # nsys has exited: whatever it wrote is complete
            if time.monotonic() - t0 > timeout_s:
                return None
            time.sleep(POLL_S)

    def after_exit(self, log_path: Path, log_offset: int, timeout_s: float) -> NsysReport:
        """The report once nsys has exited: the one it says it generated, else the newest in
        the trace folder; raises (one line) when there is none."""
        t0 = time.monotonic()
        found = generated_report(log_path, log_offset)
        if found is not None and (self.trace_dir / found.name).is_file():
            return self.record(found, "exit", "log line", t0)
        reports = sorted(self.trace_dir.glob(REPORT_GLOB), key=lambda q: q.stat().st_mtime)
        if reports:
            return self.record(reports[-1], "exit", "newest file", t0)
        raise ServelabError(
            f"nsys wrote no report in {self.trace_dir} (no 'Generated:' line in {log_path} "
            f"and no settled report file within profile.report_timeout_s {timeout_s:g} s, "
            "nor at the server's stop)"
        )


def export_nsys(
    report: Path, out: Path, nsys: str, say: Say, helper: ContainerRun | None = None
) -> list[str]:
    """`nsys export --type=sqlite` of the report (in a container: the same nsys, in the same
    image, without GPUs); the report and its export, relative to the profile folder."""
    sqlite = report.with_suffix(".sqlite")
    cmd = nsys_export_command(report.resolve(), sqlite.resolve(), nsys)
    if helper is not None:  # the image's nsys, or the host's mounted in (the host may have none)
        cmd = helper.run_command(cmd, "", 0)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = " ".join((proc.stderr or proc.stdout).split())[-500:]
        raise ServelabError(f"{' '.join(cmd)} failed with code {proc.returncode}: {detail}")
    say(f"exported {report.name} to {sqlite.name}")
    return [report.relative_to(out).as_posix(), sqlite.relative_to(out).as_posix()]
