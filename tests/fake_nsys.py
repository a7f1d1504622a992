"""A stand-in for the `nsys` CLI, with tests/fake_vllm_server.py: `profile` records its
options and runs the command after them; `export` writes an nsys-schema SQLite export in which
a 2-layer model runs one forward every 2 ms of the capture, its attention grid's y the number of
requests in flight at that moment (as the fake server logged them)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nsys_fixture import NsysFixture  # noqa: E402

PERIOD_NS = 2_000_000


def profile(args: list[str]) -> None:
    i = 0
    while args[i].startswith("--"):
        i += 1
    options, command = args[:i], args[i:]
    output = next(a.split("=", 1)[1] for a in options if a.startswith("--output="))
    with open(output + ".args.json", "w", encoding="utf-8") as fh:
        json.dump(options, fh)
    os.environ["FAKE_NSYS_OUTPUT"] = output
    os.execvp(command[0], command)


def export(args: list[str]) -> None:
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


if __name__ == "__main__":
    {"profile": profile, "export": export}[sys.argv[1]](sys.argv[2:])
