"""Speed of `servelab profile analyze` on a 5-million-kernel nsys SQLite export, against
SQLite's own full-scan rate on the same file.

    python benchmarks/bench_trace.py [--kernels 5000000] [--unordered] [--repeat 3] [--json]

The trace is generated with nsys's schema (tests/nsys_fixture.py) by one SQL statement: a
36-layer model, 11 kernels per layer (one an all-reduce on a second stream that overlaps the
next kernels), graph-replayed forwards, and four windows whose batch is 1, 8, 32 and 64. It is
cached in $TMPDIR (about 0.4 GB). The baseline is one aggregate query that reads, for every
kernel row, each column the analysis uses; the analysis is the full `profile analyze` (busy
time, families, attention paths, forwards, steady state). Both take the best of --repeat runs.
The ratio to `SELECT SUM("end"-start)` alone (two columns, no window or name) is printed too.
`--unordered` stores the rows out of start order, which costs the busy pass a sort.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from nsys_fixture import DDL, SESSION_START  # noqa: E402

from servelab.profile.trace_analysis import TraceOptions, analyze_trace  # noqa: E402
from servelab.profile.windows import parse_windows  # noqa: E402

LAYERS = 36
PER_LAYER = 11  # 10 compute kernels on stream 7, one all-reduce (slot 4) on stream 13
TAIL = 2  # lm_head gemm and sampler per forward
PER_FORWARD = LAYERS * PER_LAYER + TAIL
SLOT_NS = 5_000
PERIOD_NS = PER_FORWARD * SLOT_NS + 200_000
BATCHES = (1, 8, 32, 64)
NAMES = [
    "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NTT",  # qkv
    "triton_poi_fused_rotary_emb_0",
    "flash_fwd_splitkv_kernel",
    "nvjet_tst_64x64_64x4_1x1_v_bz_NNT",  # o_proj
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
    "rms_norm_kernel",
    "nvjet_tst_256x128_64x4_2x1_h_bz_NTT",  # gate_up
    "triton_poi_fused_mul_silu_1",
    "nvjet_tst_128x128_64x4_1x2_h_bz_NTN",  # down
    "fused_add_rms_norm_kernel",
    "reshape_and_cache_flash_kernel",
    "nvjet_tst_lm_head",
    "argmax_kernel",
]


def generate(path: Path, kernels: int, unordered: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    for table in (
        "StringIds",
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "TARGET_INFO_SESSION_START_TIME",
        "TARGET_INFO_GPU",
        "META_DATA_EXPORT",
    ):
        con.execute(DDL[table])
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(i + 1, n) for i, n in enumerate(NAMES)]
        + [(i + 101, f"void {n}<128>(Params)") for i, n in enumerate(NAMES)],
    )
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (SESSION_START,))
    con.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name) VALUES (0, 0, 'NVIDIA H100')")
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.16.1')")
    forwards = kernels // PER_FORWARD + 1
    per_window = forwards // len(BATCHES) + 1
    batch = "CASE f / {pw} {whens} END".format(
        pw=per_window, whens=" ".join(f"WHEN {i} THEN {b}" for i, b in enumerate(BATCHES))
    )
    order = f"ORDER BY (i * 7919) % {kernels}" if unordered else ""
    con.execute(f"""
        WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < {kernels - 1}),
        k AS (SELECT i, i / {PER_FORWARD} AS f, i % {PER_FORWARD} AS p FROM seq),
        kk AS (SELECT i, f, p, {batch} AS b,
                      CASE WHEN p < {LAYERS * PER_LAYER} THEN p % {PER_LAYER}
                           ELSE {PER_LAYER} + p - {LAYERS * PER_LAYER} END AS j FROM k)
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL
        SELECT f * {PERIOD_NS} + p * {SLOT_NS},
               f * {PERIOD_NS} + p * {SLOT_NS} + CASE j WHEN 2 THEN 1500 + 40 * b
                                                      WHEN 4 THEN 30000 WHEN 10 THEN 1200
                                                      ELSE 4000 END,
               0, 1, CASE j WHEN 4 THEN 13 ELSE 7 END, f, 42, j + 101, j + 1, NULL, 1, 0, 64,
               CASE j WHEN 2 THEN 1 ELSE 16 END,
               CASE j WHEN 2 THEN b ELSE 1 + b / 16 END,
               CASE j WHEN 2 THEN 32 ELSE 1 END,
               128, 1, 1, 0, 1024, 0, 0, i, 0,
               CASE WHEN f % {per_window} = 0 THEN NULL ELSE p + 1 END, 1
        FROM kk {order}""")
    con.commit()
    con.close()
    os.replace(tmp, path)


def windows(kernels: int) -> list[Any]:
    forwards = kernels // PER_FORWARD + 1
    per_window = forwards // len(BATCHES) + 1
    out = []
    for w, b in enumerate(BATCHES):
        lo = w * per_window * PERIOD_NS
        hi = min((w + 1) * per_window, forwards) * PERIOD_NS
        out.append(
            {
                "label": f"c{b:04d}",
                "start_ns": SESSION_START + lo,
                "end_ns": SESSION_START + hi,
                "clock": "epoch",
                "output_tokens": b * (hi - lo) // PERIOD_NS,
            }
        )
    return parse_windows({"windows": out}, "bench")


FULL_SCAN = (
    'SELECT COUNT(*), SUM("end" - start), MAX(deviceId), MAX(shortName), '
    "MAX(demangledName), MAX(gridX), MAX(gridY), MAX(gridZ) FROM CUPTI_ACTIVITY_KIND_KERNEL"
)
# The narrowest scan: two columns at the front of each record (a lower bound, not the anchor)
SUM_SCAN = 'SELECT SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL'


def full_scan(path: Path, sql: str = FULL_SCAN) -> float:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    t = time.perf_counter()
    con.execute(sql).fetchone()
    dt = time.perf_counter() - t
    con.close()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=5_000_000)
    ap.add_argument("--unordered", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--db", type=Path, help="where to keep the generated trace")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    name = f"servelab-bench-{args.kernels}{'-unordered' if args.unordered else ''}.sqlite"
    db = args.db or Path(tempfile.gettempdir()) / name
    if not db.exists():
        t = time.perf_counter()
        generate(db, args.kernels, args.unordered)
        print(
            f"generated {db} ({db.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
        )
    wins = windows(args.kernels)
    scan = min(full_scan(db) for _ in range(args.repeat))
    sum_scan = min(full_scan(db, SUM_SCAN) for _ in range(args.repeat))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    runs = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        res = analyze_trace([db], wins, TraceOptions(layers=LAYERS))
        runs.append(time.perf_counter() - t)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    steady = {
        k: (w["steady"] or {}).get("population_mean") for k, w in res.profile["windows"].items()
    }
    assert steady == {f"c{b:04d}": float(b) for b in BATCHES}, steady
    out = {
        "kernels": args.kernels,
        "ordered": not args.unordered,
        "file_mb": round(db.stat().st_size / 1e6, 1),
        "full_scan_s": round(scan, 3),
        "analyze_s": round(min(runs), 3),
        "ratio": round(min(runs) / scan, 2),
        "sum_scan_s": round(sum_scan, 3),
        "ratio_to_sum_scan": round(min(runs) / sum_scan, 2),
        "kernels_per_s_scan": round(args.kernels / scan),
        "kernels_per_s_analyze": round(args.kernels / min(runs)),
        "peak_rss_growth_mb": round((rss1 - rss0) / 1024, 1),
        "forwards": {k: w["forwards"]["count"] for k, w in res.profile["windows"].items()},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{args.kernels:,} kernels ({out['file_mb']} MB, "
            f"{'ordered' if out['ordered'] else 'unordered'}): SQLite full scan "
            f"{scan:.2f} s, profile analyze {min(runs):.2f} s, ratio {out['ratio']}x "
            f"(goal <= 3); peak RSS grew {out['peak_rss_growth_mb']} MB; against "
            f'SUM("end"-start) alone ({sum_scan:.2f} s): {out["ratio_to_sum_scan"]}x'
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
