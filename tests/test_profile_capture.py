"""The capture side without a GPU: command lines, the plan, the workflow, the NVTX ranges,
"not profiled" records, and profile.json against its JSON Schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from aiohttp import web
from experiment_fixtures import MakeJob, capture_job, measure_job
from nsys_fixture import (
    LAYERS,
    gpu_uuid,
    model_config,
    scenario,
    scenario_windows,
    windows_file,
)
from sse_servers import serve_app
from workflow_env import snakemake_env

from servelab.config import load, validate
from servelab.env.engine_shim import SHIM
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.profile import capture, commands
from servelab.profile.capture import profiled_launch, run_profile
from servelab.profile.commands import (
    nsys_export_command,
    nsys_profile_command,
    torch_profiler_config,
    vllm_profiler_args,
)
from servelab.profile.plan import Decision, profile_plan
from servelab.profile.report import analyze_capture
from servelab.profile.trace_analysis import TraceOptions, analyze_trace
from servelab.profile.windows import Window, load_windows, parse_windows, windows_json

REPO = Path(__file__).resolve().parents[1]
MISSING = "nsys (nsys) not found on PATH or in the usual install folders"
SCHEMA = json.loads((REPO / "src" / "servelab" / "schemas" / "profile.schema.json").read_text())
RUNTIME = {"python": "/opt/venv/bin/python"}


def plan_of(cfg: dict[str, Any], which: Any) -> dict[str, Decision]:
    """profile_plan of a validated config dict (no install folders: this host's are not
    looked at)."""
    return profile_plan(Experiment.from_dict(cfg), which, globs=())


def launch_of(
    cfg: dict[str, Any], exp_dir: Path, sc: str, tool: str, *, interface: str, nsys: str, port: int
) -> Any:
    """The profiled launch of `sc` (the runtime's python /opt/venv/bin/python, the model in
    exp_dir/model)."""
    job = measure_job(cfg, exp_dir, runtime=RUNTIME)
    return profiled_launch(capture_job(job, sc, tool, nsys), interface, port)


def gpu_config(**profile: Any) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["runtime"].update(device="gpu", gpus=1)
    raw["profile"] = {"server_configs": ["max-num-seqs-8"], **profile}
    return validate(raw, "test").to_dict()


def test_nsys_command_lines() -> None:
    # one capture range, ended by cudaProfilerStop (the report is written while the server
    # runs on); no CPU sampling or context-switch tracing
    assert nsys_profile_command(Path("/r/profile/x/nsys/profile")) == [
        "nsys",
        "profile",
        "--trace=cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--cuda-graph-trace=node",
        "--trace-fork-before-exec=true",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        "--output=/r/profile/x/nsys/profile",
    ]
    assert nsys_export_command(Path("p.nsys-rep"), Path("p.sqlite"), "/usr/bin/nsys") == [
        "/usr/bin/nsys",
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        "--output=p.sqlite",
        "p.nsys-rep",
    ]


def test_gpu_config_runs_the_server_under_nsys(tmp_path: Path) -> None:
    cfg = gpu_config(tool="auto")
    decision = plan_of(cfg, which=lambda name: "/usr/local/bin/nsys")["max-num-seqs-8"]
    assert decision.tool == "nsys"
    out = tmp_path / "profile" / "max-num-seqs-8"
    launch = launch_of(
        cfg,
        tmp_path,
        "max-num-seqs-8",
        "nsys",
        interface="config",
        nsys="/usr/local/bin/nsys",
        port=8123,
    )
    cmd = launch.command()
    server = cmd.index("/opt/venv/bin/python")
    assert cmd[:server] == nsys_profile_command(
        (out / "nsys" / "profile").resolve(), "/usr/local/bin/nsys"
    )
    assert cmd[server : server + 4] == [
        "/opt/venv/bin/python",
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
    ]
    assert cmd[cmd.index("--profiler-config") + 1] == '{"profiler": "cuda"}'
    assert cmd[cmd.index("--max-num-seqs") + 1] == "8" and cmd[cmd.index("--port") + 1] == "8123"
    assert launch.env["HF_HUB_OFFLINE"] == "1" and "VLLM_TORCH_CUDA_PROFILE" not in launch.env
    assert launch.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # vLLM's guide, with nsys
    # a vLLM without --profiler-config: no environment variable starts its CUDA profiler any
    # more (VLLM_TORCH_CUDA_PROFILE is gone), so nsys cannot drive a capture range there
    with pytest.raises(ServelabError, match=r"^profile.tool nsys: the runtime's vLLM has no "
                       r"--profiler-config .*or profile.tool torch$"):  # fmt: skip
        launch_of(cfg, tmp_path, "max-num-seqs-8", "nsys", interface="env", nsys="nsys", port=8123)


def test_cpu_capture_is_bounded(tmp_path: Path) -> None:
    cfg = load(REPO / "config" / "config.yaml").to_dict()
    assert plan_of(cfg, which=lambda name: None)["max-num-seqs-8"].tool == "torch"
    launch = launch_of(
        cfg,
        tmp_path,
        "max-num-seqs-1",
        "torch",
        interface="config",
        nsys="nsys",
        port=9000,
    )
    cmd = launch.command()
    assert cmd[0] == "/opt/venv/bin/python"  # no wrapper
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in launch.env  # the torch profiler: unchanged
    pc = json.loads(cmd[cmd.index("--profiler-config") + 1])
    assert pc["profiler"] == "torch" and pc["torch_profiler_with_stack"] is False
    assert pc["torch_profiler_record_shapes"] is False and pc["torch_profiler_with_memory"] is False
    assert pc["max_iterations"] == cfg["profile"]["max_iterations"] > 0
    assert pc["ignore_frontend"] is True
    assert Path(pc["torch_profiler_dir"]).is_absolute()
    args, env = vllm_profiler_args("torch", tmp_path, "env", 64)
    assert args == [] and env["VLLM_TORCH_PROFILER_WITH_STACK"] == "0"
    assert env["VLLM_TORCH_PROFILER_DIR"] == str(tmp_path)


def test_plan_decisions_and_errors() -> None:
    none = lambda name: None  # noqa: E731
    found = lambda name: "/bin/nsys"  # noqa: E731
    auto = gpu_config()
    d = plan_of(auto, none)["max-num-seqs-8"]
    assert d.tool == "torch" and "nsys (nsys) not found" in (d.note or "")
    d = plan_of(gpu_config(tool="nsys"), none)["max-num-seqs-8"]
    assert d.tool is None and d.reason == MISSING
    with pytest.raises(
        ServelabError,
        match=r"profile.required is true but nsys \(nsys\) not "
        r"found on PATH or in the usual install folders; install Nsight Systems",
    ):
        plan_of(gpu_config(tool="nsys", required=True), none)
    assert plan_of(gpu_config(tool="nsys", required=True), found)["max-num-seqs-8"].tool == "nsys"
    cpu = load(REPO / "config" / "config.yaml").to_dict()
    cpu["profile"]["tool"] = "nsys"
    assert (
        plan_of(cpu, found)["max-num-seqs-8"].reason == "profile.tool nsys needs runtime.device gpu"
    )
    cpu["profile"].update(tool="auto", enabled=False, required=True)
    assert plan_of(cpu, none)["max-num-seqs-1"].reason == "profile.enabled is false"
    cpu["profile"].update(enabled=True, server_configs=["max-num-seqs-9"])
    with pytest.raises(ServelabError, match="profile.server_configs: 'max-num-seqs-9' is not in"):
        plan_of(cpu, none)


def _dry_run(tmp_path: Path, cfg: dict[str, Any], path: str) -> subprocess.CompletedProcess[str]:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["results_dir"] = str(tmp_path / "results")
    raw["runtime"].update(device="gpu", gpus=1)
    raw["profile"] = cfg
    cfg_path = tmp_path / "gpu.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    env = snakemake_env({**os.environ, "PATH": path})
    return subprocess.run(
        ["snakemake", "-n", "--cores", "1", "--configfile", str(cfg_path), "--nolock"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_workflow_stops_before_anything_when_required_nsys_is_missing(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    proc = _dry_run(tmp_path, {"tool": "nsys", "required": True}, f"{bindir}:/usr/bin:/bin")
    assert proc.returncode != 0
    assert f"config error: profile.required is true but {MISSING}" in (proc.stdout + proc.stderr)
    assert not (tmp_path / "results").exists()
    # with nsys on PATH the same config plans one profile job per configuration
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nsys").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nsys").chmod(0o755)
    proc = _dry_run(tmp_path, {"tool": "nsys", "required": True}, f"{fake}:{bindir}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "rule profile:" in proc.stdout and "profile_report" in proc.stdout


def test_not_profiled_is_an_explicit_record(tmp_path: Path, make_job: MakeJob) -> None:
    cfg = gpu_config(tool="nsys")
    job = make_job(cfg, runtime=RUNTIME)
    rec = run_profile(job, "max-num-seqs-8", which=lambda name: None, nsys_globs=())
    assert rec["status"] == "not profiled" and rec["reason"] == MISSING
    prof = analyze_capture(job.exp.profile, job.paths, "max-num-seqs-8", job.model_dir)
    out = tmp_path / "profile" / "max-num-seqs-8"
    assert json.loads((out / "profile.json").read_text()) == prof
    jsonschema.validate(prof, SCHEMA)
    assert f"Not profiled: {MISSING}" in (out / "profile.md").read_text()
    assert (out / "families.csv").read_text() == "window,family,calls,total_us,us_per_token\n"


def test_profile_json_satisfies_its_schema(tmp_path: Path) -> None:
    trace = scenario().write(tmp_path / "t.sqlite")
    windows = load_windows(windows_file(tmp_path / "w.json", scenario_windows()))
    prof = analyze_trace([trace], windows, TraceOptions(layers=LAYERS)).profile
    jsonschema.validate(prof, SCHEMA)
    prof["windows"]["c0001"]["active_fraction"]["0"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(prof, SCHEMA)


def test_analyze_capture_reads_the_capture_layout(tmp_path: Path, make_job: MakeJob) -> None:
    cfg = gpu_config(tool="nsys")
    out = tmp_path / "profile" / "max-num-seqs-8"
    (out / "nsys").mkdir(parents=True)
    scenario().write(out / "nsys" / "profile.sqlite")
    windows_file(out / "windows.json", scenario_windows())
    model_config(tmp_path / "config.json", LAYERS)
    (out / "capture.json").write_text(
        json.dumps(
            {
                "status": "profiled",
                "tool": "nsys",
                "traces": ["nsys/profile.nsys-rep", "nsys/profile.sqlite"],
            }
        )
    )
    # the sweep's telemetry of the configuration sampled host GPU 3 (NVML index 3)
    point = tmp_path / "raw" / "max-num-seqs-8" / "rep01" / "c0008" / "point.json"
    point.parent.mkdir(parents=True)
    sampled = {"device": 3, "uuid": gpu_uuid(3), "name": "NVIDIA H100 80GB HBM3"}
    point.write_text(json.dumps({"telemetry": {"gpu": {"devices": [sampled]}}}))
    job = make_job(cfg, model_dir=tmp_path)
    prof = analyze_capture(job.exp.profile, job.paths, "max-num-seqs-8", job.model_dir)
    assert prof["server_config"] == "max-num-seqs-8" and prof["tool"] == "nsys"
    assert prof["settings"]["layers_source"] == "model config.json"
    assert prof["windows"]["c0002"]["steady"]["population_mean"] == 2.0
    jsonschema.validate(prof, SCHEMA)
    # the trace's GPU 3 (the one that ran the kernels) is the telemetry's GPU 3, by UUID
    gpus = {g["id"]: g for g in prof["trace"]["gpus"]}
    assert (gpus["3"]["telemetry_device"], gpus["3"]["matched_by"]) == (3, "uuid")
    assert gpus["0"]["telemetry_device"] is None and len(gpus) == 8
    assert "| c0001 | c0002 | 2 | 1.4 |" in (out / "profile.md").read_text()


def test_windows_json_round_trip() -> None:
    w = [Window("c0001", 10, 20, "epoch", 128, {"concurrency": 1, "requests": 1})]
    data = windows_json(w, server_config="a", tool="torch")
    assert data["windows"] == [
        {
            "label": "c0001",
            "start_ns": 10,
            "end_ns": 20,
            "clock": "epoch",
            "output_tokens": 128,
            "concurrency": 1,
            "requests": 1,
        }
    ]
    assert parse_windows(data, "x") == w
    with pytest.raises(ServelabError, match="format_version 2 is not supported"):
        parse_windows({**data, "format_version": 2}, "x")


# --- the client's NVTX ranges ---------------------------------------------------------------


class FakeDomain:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def get_registered_string(self, s: str) -> tuple[str, str]:
        self.log.append(("register", s))
        return ("handle", s)

    def get_event_attributes(self, message: Any, payload: int) -> dict[str, Any]:
        return {"message": message, "payload": payload}

    def start_range(self, attrs: dict[str, Any]) -> int:
        self.log.append(("start", attrs["message"][1], attrs["payload"]))
        return int(attrs["payload"]) + 100

    def end_range(self, rid: int) -> None:
        self.log.append(("end", rid))


@pytest.fixture
def fake_nvtx(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []
    mod = types.ModuleType("nvtx")
    mod.get_domain = lambda name: (log.append(("domain", name)), FakeDomain(log))[1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    return log


@pytest.fixture
def sse_server() -> Iterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in "ab":
            chunk = {"choices": [{"index": 0, "text": t}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(
            b'data: {"choices": [], "usage": {"prompt_tokens": 3, '
            b'"completion_tokens": 2}}\n\ndata: [DONE]\n\n'
        )
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    yield from serve_app(app)


def test_client_emits_one_nvtx_range_per_request(
    fake_nvtx: list[tuple[Any, ...]], sse_server: str
) -> None:
    w = capture.RequestSettings(base_url=sse_server, model="m", max_tokens=2)
    run = capture.run_diagnostic_point(w, ["p0", "p1", "p2"], 2, "c0002")
    assert [r.ok for r in run.records] == [True, True, True]
    assert run.started_epoch_ns < run.finished_epoch_ns
    assert fake_nvtx[:2] == [("domain", "servelab"), ("register", "c0002")]
    starts = sorted(e[2] for e in fake_nvtx if e[0] == "start")
    ends = sorted(e[1] for e in fake_nvtx if e[0] == "end")
    assert starts == [0, 1, 2] and ends == [100, 101, 102]
    assert {e[1] for e in fake_nvtx if e[0] == "start"} == {"c0002"}


def test_without_nvtx_the_client_runs_unchanged(
    monkeypatch: pytest.MonkeyPatch, sse_server: str
) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import fails
    assert not capture.NvtxRanges("c0001").active
    w = capture.RequestSettings(base_url=sse_server, model="m", max_tokens=2)
    run = capture.run_diagnostic_point(w, ["p0"], 1, "c0001")
    assert run.records[0].ok and run.records[0].request_id == "c0001-00000"


@pytest.mark.e2e
def test_bounded_settings_are_fields_of_the_runtime_vllm(vllm_runtime: dict) -> None:
    """The --profiler-config keys servelab sends exist in the runtime's vLLM (no import)."""
    proc = subprocess.run(
        [
            vllm_runtime["python"],
            "-c",
            "import importlib.util; print(importlib.util.find_spec("
            "'vllm').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    source = (Path(proc.stdout.strip()) / "config" / "profiler.py").read_text()
    for key in torch_profiler_config(Path("/tmp"), 8):
        assert f"    {key}:" in source, key
    assert commands.vllm_interface(vllm_runtime["python"]) == "config"


A100_NSYS = "/opt/nvidia/nsight-systems-cli/2025.5.1/target-linux-x64/nsys"  # not on this host


def fake_install(root: Path, version: str) -> Path:
    """An Nsight Systems install folder as NVIDIA's nsight-systems-cli package lays it out,
    its nsys being tests/fake_nsys.py."""
    nsys = root / "opt" / "nvidia" / "nsight-systems-cli" / version / "target-linux-x64" / "nsys"
    nsys.parent.mkdir(parents=True)
    nsys.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO / "tests" / "fake_nsys.py"} "$@"\n')
    nsys.chmod(0o755)
    return nsys


def fake_gpu_setup(tmp_path: Path, **profile: Any) -> tuple[dict[str, Any], Path, Path]:
    """(config, model folder, the fake server as the runtime's python): a GPU config whose
    profile.nsys is the A100 experiment's path, which this host does not have."""
    fakepy = tmp_path / "bin" / "python"
    fakepy.parent.mkdir()
    fakepy.write_text(
        f'#!/bin/sh\nexec {sys.executable} {REPO / "tests" / "fake_vllm_server.py"} "$@"\n'
    )
    fakepy.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    model_config(model / "config.json", 2)
    vocab = {f"w{i}": i for i in range(1, 60)}
    (model / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["runtime"].update(device="gpu", gpus=1)
    raw["server"].update(
        startup_timeout_s=60, shutdown_timeout_s=10, args={}, configs=[{"name": "fake"}]
    )
    raw["workload"].update(input_tokens=4, output_tokens=10)
    raw["profile"] = {
        "tool": "nsys",
        "required": True,
        "nsys": A100_NSYS,
        "vllm_interface": "config",
        "concurrency": [1, 2],
        "warmup_requests": 2,
        "report_timeout_s": 30,
        **profile,
    }
    return validate(raw, "test").to_dict(), model, fakepy


def capture_with_fakes(tmp_path: Path, cfg: dict[str, Any], model: Path, fakepy: Path) -> Any:
    """run_profile on this host with no nsys on PATH: the install folders are tmp_path's."""
    return run_profile(
        measure_job(cfg, tmp_path, model_dir=model, runtime={"python": str(fakepy)}),
        "fake",
        which=lambda name: None,
        nsys_globs=(str(tmp_path / "opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys"),),
    )


def test_gpu_path_end_to_end_with_fake_nsys_and_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nsys capture flow (server under `nsys profile`, one capture range driven by
    /start_profile and /stop_profile, the report nsys says it generated, `nsys export`,
    analysis) against tests/fake_nsys.py and tests/fake_vllm_server.py: no GPU, no vLLM, and
    no nsys at the configured path: the newest one in the install folders is used."""
    fake_install(tmp_path, "2024.6.1")
    nsys = fake_install(tmp_path, "2025.5.1")
    cfg, model, fakepy = fake_gpu_setup(tmp_path)
    monkeypatch.setenv("FAKE_NSYS_UNBUFFERED", "1")  # its "Generated:" line reaches the log
    rec = capture_with_fakes(tmp_path, cfg, model, fakepy)
    out = tmp_path / "profile" / "fake"
    assert rec["status"] == "profiled" and rec["tool"] == "nsys"
    assert rec["traces"] == ["nsys/profile.nsys-rep", "nsys/profile.sqlite"]
    assert rec["command"][:2] == [str(nsys), "profile"]
    assert rec["nsys"]["source"] == "host" and rec["nsys"]["version"] == "2025.5.1.121"
    assert rec["nsys"]["host"]["found_by"] == "install folder"
    # written at the end of the capture range, while the server ran: not at its exit
    assert rec["nsys_report"]["generated"] == "range end"
    assert rec["nsys_report"]["found_by"] == "log line"
    assert rec["nsys_report"]["path"] == "nsys/profile.nsys-rep"
    assert rec["command"][rec["command"].index("--profiler-config") + 1] == '{"profiler": "cuda"}'
    assert rec["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    recorded = json.loads((out / "nsys" / "profile.args.json").read_text())
    assert recorded == nsys_profile_command((out / "nsys" / "profile").resolve())[2:]
    capture_schema = json.loads((REPO / "src/servelab/schemas/capture.schema.json").read_text())
    jsonschema.validate(json.loads((out / "capture.json").read_text()), capture_schema)

    job = measure_job(cfg, tmp_path, model_dir=model)
    prof = analyze_capture(job.exp.profile, job.paths, "fake", model)
    jsonschema.validate(prof, SCHEMA)
    assert prof["trace"]["kind"] == "nsys-sqlite" and prof["settings"]["population_dim"] == "y"
    c1, c2 = prof["windows"]["c0001"], prof["windows"]["c0002"]
    assert c1["source"] == c2["source"] == "wallclock"
    assert c1["steady"]["population_mean"] == 1.0 and c2["steady"]["population_mean"] == 2.0
    assert 0 < c1["active_fraction"]["0"] < 0.2
    assert c2["families"]["attention"]["calls"] >= 2 * c2["forwards"]["count"]
    assert prof["ratios"][0]["population_ratio"] == 2.0
    assert not c1["no_kernel_activity"] and not c2["no_kernel_activity"]


def test_nsys_points_are_apart_and_windows_json_says_what_the_client_emitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nsys points of one capture range run POINT_GAP_S apart (a kernel at a window's
    edge lands in no window, not in the neighbour's), windows.json records the gap, and its
    `client_nvtx_emitted` cannot be read as if the trace held the client's ranges."""
    monkeypatch.setenv("FAKE_NSYS_UNBUFFERED", "1")
    fake_install(tmp_path, "2025.5.1")
    cfg, model, fakepy = fake_gpu_setup(tmp_path)
    rec = capture_with_fakes(tmp_path, cfg, model, fakepy)
    assert rec["status"] == "profiled", rec.get("reason")
    doc = json.loads((tmp_path / "profile" / "fake" / "windows.json").read_text())
    gap = capture.POINT_GAP_S
    assert gap >= 1.0 and doc["point_gap_s"] == gap
    assert "nvtx" not in doc and doc["client_nvtx_emitted"] is capture.nvtx_available()
    w1, w2 = doc["windows"]
    assert w2["start_ns"] - w1["end_ns"] >= gap * 1e9
    windows_schema = json.loads((REPO / "src/servelab/schemas/windows.schema.json").read_text())
    jsonschema.validate(doc, windows_schema)
    described = windows_schema["properties"]["client_nvtx_emitted"]["description"]
    assert "Not whether a trace holds them" in described


def test_a_buffered_generated_line_does_not_hold_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nsys's output goes to the server log through a pipe and is buffered: its
    "Generated:" line comes only when it exits. The report is taken once its file has settled
    (written in pieces over 2 s by the fake), at the range end, while the server runs: not
    after profile.report_timeout_s (60 s here) and a stop."""
    from servelab.profile import nsys_report

    monkeypatch.setattr(nsys_report, "REPORT_SETTLE_S", 1.0)
    monkeypatch.setenv("FAKE_NSYS_GENERATE_S", "2")
    fake_install(tmp_path, "2025.5.1")
    cfg, model, fakepy = fake_gpu_setup(tmp_path, report_timeout_s=60)
    t0 = time.monotonic()
    rec = capture_with_fakes(tmp_path, cfg, model, fakepy)
    assert rec["status"] == "profiled", rec.get("reason")
    report = rec["nsys_report"]
    assert (report["generated"], report["found_by"]) == ("range end", "settled file")
    assert 2.0 <= report["wait_s"] < 20 and time.monotonic() - t0 < 50
    log = (tmp_path / "profile" / "fake" / "server.log").read_text()
    assert "Generated:" in log  # flushed at nsys's exit, after the report was taken
    assert rec["traces"] == ["nsys/profile.nsys-rep", "nsys/profile.sqlite"]


def test_a_report_written_only_at_exit_is_waited_for_at_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `--capture-range-end=repeat` nsys writes the report only when the server exits:
    after profile.report_timeout_s the job stops the server and gives nsys that much more
    time, so the report is still made."""
    args = tuple(
        "--capture-range-end=repeat" if a.startswith("--capture-range-end") else a
        for a in commands.NSYS_PROFILE_ARGS
    )
    monkeypatch.setattr(commands, "NSYS_PROFILE_ARGS", args)
    monkeypatch.setenv("FAKE_NSYS_GENERATE_S", "2")
    fake_install(tmp_path, "2025.5.1")
    cfg, model, fakepy = fake_gpu_setup(tmp_path, report_timeout_s=3)
    cfg["server"]["shutdown_timeout_s"] = 1  # too short alone for the 2 s the report takes
    rec = capture_with_fakes(tmp_path, cfg, model, fakepy)
    assert rec["status"] == "profiled", rec.get("reason")
    assert rec["nsys_report"]["generated"] == "exit"
    assert rec["traces"] == ["nsys/profile.nsys-rep", "nsys/profile.sqlite"]


def test_a_failed_capture_is_a_not_profiled_record_that_keeps_the_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nsys writes no report (`--capture-range-end=none`): with profile.required false the
    job records "not profiled" and why, keeps the measured points, and the analysis says so;
    with profile.required true the job fails."""
    args = tuple(
        "--capture-range-end=none" if a.startswith("--capture-range-end") else a
        for a in commands.NSYS_PROFILE_ARGS
    )
    monkeypatch.setattr(commands, "NSYS_PROFILE_ARGS", args)
    fake_install(tmp_path, "2025.5.1")
    cfg, model, fakepy = fake_gpu_setup(tmp_path, report_timeout_s=1, required=False)
    cfg["server"]["shutdown_timeout_s"] = 2
    rec = capture_with_fakes(tmp_path, cfg, model, fakepy)
    assert rec["status"] == "not profiled" and rec["tool"] == "nsys"
    assert rec["reason"].startswith("nsys wrote no report in ")
    assert [p["label"] for p in rec["points"]] == ["c0001", "c0002"]
    assert rec["points"][1]["requests"] == 2 and rec["traces"] == []
    out = tmp_path / "profile" / "fake"
    assert json.loads((out / "capture.json").read_text()) == rec
    assert (out / "requests" / "c0002.jsonl.gz").is_file()
    job = measure_job(cfg, tmp_path, model_dir=model)
    prof = analyze_capture(job.exp.profile, job.paths, "fake", model)
    assert prof["status"] == "not profiled" and prof["reason"] == rec["reason"]
    jsonschema.validate(prof, SCHEMA)
    cfg["profile"]["required"] = True
    with pytest.raises(ServelabError, match="nsys wrote no report in "):
        capture_with_fakes(tmp_path, cfg, model, fakepy)


@pytest.mark.parametrize(
    "range_end,while_running,app_survives",
    [("stop", True, True), ("repeat", False, True), (None, True, False)],
)
def test_fake_nsys_writes_the_report_when_the_guide_says(
    tmp_path: Path, range_end: str | None, while_running: bool, app_survives: bool
) -> None:
    """tests/fake_nsys.py as the Nsight Systems User Guide describes --capture-range-end:
    stop: the report at the range end, the app runs on; repeat: only at the app's exit;
    absent (stop-shutdown): at the range end, and the app is ended."""
    app = tmp_path / "app.py"
    app.write_text(
        "import json, os, signal, sys, time\n"
        "out = os.environ['FAKE_NSYS_OUTPUT'] + '.range.json'\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "json.dump({'start_ns': time.time_ns(), 'end_ns': time.time_ns() + 1}, open(out, 'w'))\n"
        "time.sleep(60)\n"
    )
    output = tmp_path / "profile"
    opts = ["--capture-range=cudaProfilerApi", f"--output={output}"]
    if range_end is not None:
        opts.append(f"--capture-range-end={range_end}")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_nsys.py"), "profile", *opts, sys.executable]
        + [str(app)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_NSYS_GENERATE_S": "0"},
    )
    report = Path(f"{output}.nsys-rep")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not report.exists():
        time.sleep(0.05)
    assert report.exists() == while_running
    if app_survives:
        time.sleep(0.3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)  # forwarded to the app
    stdout, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and report.exists()
    assert f"Generated:\n    {report}" in stdout
