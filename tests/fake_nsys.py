"""A stand-in for the `nsys` CLI, with tests/fake_vllm_server.py, that behaves as the Nsight
Systems User Guide describes `nsys profile` with a cudaProfilerApi capture range.

`--version` prints one line, as nsys does.

`profile [OPTIONS] COMMAND...` records its options (<output>.args.json), starts COMMAND as its
child with FAKE_NSYS_OUTPUT=<output> in its environment, forwards SIGTERM and SIGINT to it and
exits with it. The fake server records the capture range as cudaProfilerStart/Stop would
(<output>.range.json: start, end, the requests served in between). The report
<output>.nsys-rep is generated as --capture-range-end says:

- stop: when the range ends, while the application runs on; later ranges are ignored;
- stop-shutdown (also without the option: the guide's default): when the range ends, and the
  application is then terminated;
- repeat[:N]: only when the application exits.

Without --capture-range the whole run is captured and the report generated at the exit.
Generating takes $FAKE_NSYS_GENERATE_S seconds (default 0.3): the report is written in place,
in GENERATE_PIECES pieces spread over that time (a report file that exists may not be complete
yet), and then nsys prints "Generated:" and, on the next line, its path. nsys is reported to
buffer its output when it is not a terminal, and so does the fake: into a log file or a pipe
those lines come only when it exits (unless FAKE_NSYS_UNBUFFERED=1, or a terminal).

`export` writes an nsys-schema SQLite export in which a 2-layer model runs one forward every
2 ms of the capture, its attention grid's y the number of requests in flight at that moment
(as the fake server logged them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nsys_fixture import NsysFixture  # noqa: E402

PERIOD_NS = 2_000_000
VERSION = "NVIDIA Nsight Systems version 2025.5.1.121-255136380782v0"
RANGE_ENDS = ("none", "stop", "stop-shutdown", "repeat", "repeat-shutdown")
GENERATE_PIECES = 4


def _option(options: list[str], name: str) -> str | None:
    for a in options:
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
    return None


def _read_range(output: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(Path(output + ".range.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data


def _generate(output: str, rng: dict[str, Any], end_ns: int) -> None:
    """Write the report in place, piece by piece, and say so, as nsys does (buffered when
    the output is not a terminal)."""
    pause = float(os.environ.get("FAKE_NSYS_GENERATE_S", "0.3")) / GENERATE_PIECES
    report = {
        "start_ns": rng["start_ns"],
        "end_ns": rng.get("end_ns") or end_ns,
        "requests": rng.get("requests") or [],
    }
    text = json.dumps(report).encode("utf-8")
    final = Path(output + ".nsys-rep")
    step = -(-len(text) // GENERATE_PIECES)
    with open(final, "wb") as fh:
        for i in range(GENERATE_PIECES):
            time.sleep(pause)
            fh.write(text[i * step : (i + 1) * step])
            fh.flush()
    _say(f"Generating '{output}.qdstrm'\nGenerated:\n    {final}")


# What nsys has printed into its output buffer and not yet written out: a C++ program's
# stdout buffer, which PYTHONUNBUFFERED (the server's launch sets it) does not change.
_HELD: list[str] = []


def _say(text: str) -> None:
    """Print as nsys does: at once on a terminal (or with FAKE_NSYS_UNBUFFERED=1), else held
    until the fake exits."""
    if os.environ.get("FAKE_NSYS_UNBUFFERED") == "1" or sys.stdout.isatty():
        print(text, flush=True)
    else:
        _HELD.append(text)


def _flush() -> None:
    for text in _HELD:
        print(text)
    _HELD.clear()
    sys.stdout.flush()


def profile(args: list[str]) -> int:
    i = 0
    while args[i].startswith("--"):
        i += 1
    options, command = args[:i], args[i:]
    output = _option(options, "--output")
    assert output, "nsys profile: --output is required here"
    with open(output + ".args.json", "w", encoding="utf-8") as fh:
        json.dump(options, fh)
    capture_range = _option(options, "--capture-range")
    range_end = (_option(options, "--capture-range-end") or "stop-shutdown").split(":")[0]
    if range_end not in RANGE_ENDS:
        print(f"nsys: invalid --capture-range-end {range_end}", file=sys.stderr)
        return 1
    Path(output + ".range.json").unlink(missing_ok=True)
    started_ns = time.time_ns()
    child = subprocess.Popen(command, env={**os.environ, "FAKE_NSYS_OUTPUT": output})

    def forward(signum: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    generated = False
    at_range_end = capture_range == "cudaProfilerApi" and range_end in ("stop", "stop-shutdown")
    while child.poll() is None:
        rng = _read_range(output) if at_range_end and not generated else None
        if rng is not None and rng.get("end_ns"):
            _generate(output, rng, rng["end_ns"])
            generated = True
            if range_end == "stop-shutdown":
                child.terminate()
        time.sleep(0.05)
    code = child.wait()
    if not generated and range_end != "none":
        rng = _read_range(output) if capture_range == "cudaProfilerApi" else None
        if capture_range != "cudaProfilerApi":
            rng = {"start_ns": started_ns}
        if rng is not None:
            _generate(output, rng, time.time_ns())
    _flush()
    return code


def export(args: list[str]) -> int:
    output = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    report = json.loads(Path(args[-1]).read_text(encoding="utf-8"))
    start, end = report["start_ns"], report["end_ns"]
    fx = NsysFixture(session_start=start)
    t = 0
    while start + t + 300_000 < end:
        now = start + t
        batch = sum(1 for a, b in report["requests"] if a <= now < b)
        if batch:
            for layer in range(2):
                s = t + layer * 100_000
                fx.kernel(s, 40_000, "nvjet_gemm", grid=(16, 1, 1))
                fx.kernel(
                    s + 40_000, 10_000 + 5_000 * batch, "flash_fwd_kernel", grid=(1, batch, 8)
                )
        t += PERIOD_NS
    fx.write(Path(output))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(VERSION)
        return 0
    return {"profile": profile, "export": export}[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
