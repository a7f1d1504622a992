"""Measuring a server servelab did not launch (runtime.kind endpoint): the config's rules, the
runtime stage's probe, the model stage's record, the session that starts nothing, and a sweep
over it, against a fake server in the test process (tests/endpoint_fakes.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from endpoint_fakes import FakeEndpoint, model_entry, running

from servelab.config import validate
from servelab.env import endpoint
from servelab.env.model import build_model
from servelab.env.runtime import ensure_runtime
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.launch.server import EndpointServer
from servelab.launch.session import build_launch, serve
from servelab.store.jsonio import read_json
from servelab.store.records import CapacityRecord, LaunchRecord, PointRecord

URL = "http://127.0.0.1:8000"


def endpoint_config(url: str = URL, served: str = "served", **sections: Any) -> dict[str, Any]:
    """The smallest endpoint config: runtime, workload and sweep; `sections` replace them."""
    cfg: dict[str, Any] = {
        "experiment": "ep",
        "runtime": {"kind": "endpoint", "url": url, "served_model": served},
        "workload": {"input_tokens": 8, "output_tokens": 4, "waves": 1},
        "sweep": {"concurrency": [1, 2], "repeats": 1},
    }
    cfg.update(copy.deepcopy(sections))
    return cfg


def quiet(line: str) -> None:
    pass


# --- the config ----------------------------------------------------------------------------


def test_a_minimal_endpoint_config_takes_the_endpoint_defaults() -> None:
    exp = validate(endpoint_config())
    assert exp.runtime.endpoint and exp.runtime.url == URL and exp.runtime.served_model == "served"
    assert exp.server.names == ["endpoint"] and exp.server.args_of("endpoint") == {}
    assert exp.profile.enabled is False
    assert (exp.model.source, exp.model.served_name) == ("endpoint", "served")
    assert dict(exp.runtime.env) == {} and exp.runtime.compile_cache is False
    assert exp.server.engine_nice == 0


def test_the_endpoint_defaults_are_the_schema_s() -> None:
    """Each default an endpoint config takes in place of a launched server's is written once,
    beside that default, as the schema's x-endpoint-default."""
    from servelab.config import ENDPOINT_DEFAULT, load_schema

    props = load_schema()["properties"]
    found = {
        (section, key): sub[ENDPOINT_DEFAULT]
        for section in ("runtime", "server", "profile")
        for key, sub in props[section]["properties"].items()
        if ENDPOINT_DEFAULT in sub
    }
    assert found == {
        ("runtime", "compile_cache"): False,
        ("runtime", "env"): {},
        ("server", "engine_nice"): 0,
        ("server", "configs"): [{"name": "endpoint"}],
        ("profile", "enabled"): False,
    }
    resolved = validate(endpoint_config()).to_dict()
    taken = {(s, k): resolved[s][k] for s, k in found}
    taken["server", "configs"] = [{"name": c["name"]} for c in taken["server", "configs"]]
    assert taken == found  # (each configuration then gets its own defaults, args {})
    launched = validate({"sweep": {"concurrency": [1]}, "server": {"configs": [{"name": "a"}]}})
    assert launched.runtime.compile_cache is True and launched.server.engine_nice == 19


def test_a_resolved_endpoint_config_validates_as_it_was_resolved() -> None:
    """Snakemake's campaign modules and the confirm rule validate resolved configs again."""
    resolved = validate(endpoint_config()).to_dict()
    assert validate(resolved).to_dict() == resolved


def test_a_launched_server_s_config_has_no_endpoint_keys() -> None:
    """The resolved config of every other runtime stays as it was before these keys."""
    resolved = validate({"sweep": {"concurrency": [1]}, "server": {"configs": [{"name": "a"}]}})
    assert "url" not in resolved.to_dict()["runtime"] and resolved.runtime.url is None
    assert validate(resolved.to_dict()).to_dict() == resolved.to_dict()


REFUSED = [
    ({"runtime": {"kind": "endpoint", "served_model": "s"}}, "runtime.url: runtime.kind endpoint"),
    (
        {"runtime": {"kind": "endpoint", "url": "http://h:8000/v1", "served_model": "s"}},
        "runtime.url: 'http://h:8000/v1' has the path '/v1' (servelab adds /v1 itself); give "
        "the base URL, http://h:8000",
    ),
    ({"runtime": {"kind": "endpoint", "url": "h:8000", "served_model": "s"}}, "runtime.url:"),
    ({"runtime": {"kind": "endpoint", "url": URL}}, "runtime.served_model: give the model"),
    (
        {"runtime": {"kind": "endpoint", "url": URL, "served_model": "s", "lock": "x.lock"}},
        "runtime.lock: servelab does not launch the server of runtime.kind endpoint",
    ),
    (
        {"runtime": {"kind": "endpoint", "url": URL, "served_model": "s", "env": {"A": "1"}}},
        "runtime.env:",
    ),
    ({"server": {"args": {"max-num-seqs": 8}}}, "server.args: servelab did not launch"),
    (
        {"server": {"configs": [{"name": "a"}, {"name": "b"}]}},
        "server.configs: runtime.kind endpoint measures one server as it runs, 2 configurations",
    ),
    (
        {"server": {"configs": [{"name": "a", "args": {"max-num-seqs": 8}}]}},
        "server.configs[0].args:",
    ),
    ({"server": {"port": 8000}}, "server.port: configures a server launch"),
    ({"server": {"engine_nice": 19}}, "server.engine_nice:"),
    ({"profile": {"enabled": True}}, "profile.enabled: the profiling pass"),
    ({"model": {"source": "hf", "repo": "a/b"}}, "model.source: the server at runtime.url"),
    ({"model": {"served_name": "other"}}, "model.served_name:"),
]


@pytest.mark.parametrize("change,line", REFUSED, ids=[line.split(":")[0] for _, line in REFUSED])
def test_what_an_endpoint_refuses_is_one_line_naming_the_key(
    change: dict[str, Any], line: str
) -> None:
    cfg = endpoint_config()
    cfg.update(change)
    with pytest.raises(ServelabError) as err:
        validate(cfg, source="ep.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"ep.yaml: {line}"), msg


def test_a_launched_config_s_tiny_model_section_is_left_unused() -> None:
    """An endpoint config made from a launched one keeps its tiny model's section: unused."""
    model = {"source": "tiny", "served_name": "served", "tiny": {"layers": 4}}
    exp = validate(endpoint_config(model=model))
    assert (exp.model.source, exp.model.served_name) == ("endpoint", "served")


def test_a_config_of_one_named_configuration_without_args_is_taken() -> None:
    exp = validate(endpoint_config(server={"configs": [{"name": "mine"}], "lock_timeout_s": 5}))
    assert exp.server.names == ["mine"] and exp.server.lock_timeout_s == 5


@pytest.mark.parametrize(
    "runtime,line",
    [
        ({"kind": "venv", "url": URL}, "runtime.url: only for runtime.kind endpoint"),
        ({"kind": "docker", "served_model": "s"}, "runtime.served_model: only for"),
    ],
)
def test_endpoint_keys_are_refused_for_a_launched_server(
    runtime: dict[str, Any], line: str
) -> None:
    cfg = {"runtime": runtime, "sweep": {"concurrency": [1]}}
    with pytest.raises(ServelabError, match=f"^c.yaml: {line}"):
        validate(cfg, source="c.yaml")
    with pytest.raises(ServelabError, match="^c.yaml: model.source: endpoint goes with"):
        validate({"model": {"source": "endpoint"}, "sweep": {"concurrency": [1]}}, source="c.yaml")


def test_the_schema_describes_the_endpoint_keys(repo: Path) -> None:
    schema = yaml.safe_load((repo / "src/servelab/schemas/config.schema.yaml").read_text())
    rt = schema["properties"]["runtime"]["properties"]
    assert "endpoint" in rt["kind"]["enum"] and "endpoint" in rt["kind"]["description"]
    for key in ("url", "served_model"):
        assert "runtime.kind endpoint" in rt[key]["description"] and rt[key]["default"] is None
    assert "endpoint" in schema["properties"]["model"]["properties"]["source"]["enum"]


def test_the_example_config_is_an_endpoint_config(repo: Path) -> None:
    exp = validate(yaml.safe_load((repo / "config/experiments/endpoint-cpu.yaml").read_text()))
    assert exp.runtime.endpoint and exp.server.names == ["endpoint"] and not exp.profile.enabled
    assert exp.sweep.most_repeats <= 3 and len(exp.sweep.levels) <= 4


def test_parse_url_writes_the_port() -> None:
    assert endpoint.parse_url("http://localhost").base == "http://localhost:80"
    assert endpoint.parse_url("https://h.example/").port == 443
    where = endpoint.parse_url("http://[::1]:8000")
    assert (where.host, where.port, where.base) == ("::1", 8000, "http://[::1]:8000")
    with pytest.raises(ServelabError, match="credentials, a query or a fragment"):
        endpoint.parse_url("http://u:p@h:1")


# --- the runtime stage: the probe ------------------------------------------------------------


def test_the_probe_records_what_the_server_says_of_itself() -> None:
    fake = FakeEndpoint(models=[model_entry("other"), model_entry("served", 2048)])
    with running(fake) as url:
        record = endpoint.probe(url + "/", "served")
    assert record["kind"] == "endpoint" and record["launched"] is False
    assert record["url"] == url and record["served_model"] == "served"
    # what /v1/models says of the served model, without the fields that change every call
    assert record["model"] == {
        "id": "served",
        "object": "model",
        "owned_by": "vllm",
        "root": "/models/served",
        "parent": None,
        "max_model_len": 2048,
    }
    assert record["models"] == ["other", "served"]
    assert record["version"] == {"version": "0.32.0"} and record["vllm_version"] == "0.32.0"
    cache = record["server_info"]["vllm:cache_config_info"]
    assert cache["num_gpu_blocks"] == "68" and cache["enable_prefix_caching"] == "False"
    assert record["python_version"] == "3.11.7" and record["process_start_time_s"] == 1.7e9
    # nothing pinned: no lock, no image, no package servelab installed
    assert (record["lock"], record["lock_sha256"], record["packages"]) == (None, None, {})
    assert record["local"] is True and record["health"] == 200


def test_a_server_without_version_or_metrics_is_recorded_with_nulls() -> None:
    with running(FakeEndpoint(version=None, metrics=None)) as url:
        record = endpoint.probe(url, "served")
    assert record["version"] is None and record["vllm_version"] is None
    assert record["server_info"] is None and record["python_version"] is None
    cap = endpoint.capacity_facts(record)
    assert cap["kv_cache_tokens"] is None and cap["max_concurrency"] is None
    assert cap["max_concurrency_tokens_per_request"] is None and cap["cache_config"] is None


def test_an_unreachable_url_fails_in_one_line_naming_runtime_url() -> None:
    with running(FakeEndpoint()) as url:
        pass  # the port is free again
    with pytest.raises(ServelabError) as err:
        endpoint.probe(url, "served", timeout_s=2)
    assert str(err.value) == (
        f"runtime.url: nothing answers at {url} (GET /v1/models: connection refused); start "
        "the server, or give the base URL it listens on (scheme, host, port; no /v1)"
    )


def test_a_model_the_server_does_not_serve_names_those_it_does() -> None:
    fake = FakeEndpoint(models=[model_entry("a"), model_entry("b")])
    with running(fake) as url, pytest.raises(ServelabError) as err:
        endpoint.probe(url, "served")
    assert str(err.value) == (
        f"runtime.served_model: 'served' is not served at {url} (its /v1/models lists 'a', "
        "'b'); give one of those"
    )


def test_a_server_that_lists_no_models_is_not_taken_for_one() -> None:
    with running(FakeEndpoint(fail={"/v1/models": 404})) as url, pytest.raises(ServelabError) as e:
        endpoint.probe(url, "served")
    assert str(e.value).startswith(f"runtime.url: {url} answers GET /v1/models with HTTP 404")


def test_the_runtime_stage_probes_an_endpoint(make_job: Any) -> None:
    with running(FakeEndpoint()) as url:
        exp = validate(endpoint_config(url))
        said: list[str] = []
        record = ensure_runtime(exp.runtime, exp.profile, None, said.append)
    assert record["kind"] == "endpoint" and record["url"] == url
    assert said == [
        f"runtime: endpoint {url} (on this host, not launched by servelab): serves served "
        "(root /models/served, max_model_len 1024), vLLM 0.32.0"
    ]


def test_metrics_info_reads_every_info_metric_s_labels() -> None:
    text = (
        'a_info{x="1",y="two words"} 1.0\n'
        'a_info{x="2"} 1.0\n'  # a second series: the first is kept
        'b_info{quoted="say \\"hi\\""} 1\n'
        "c_total 3\n"
        "process_start_time_seconds 12.5\n"
    )
    assert endpoint.metrics_info(text) == {
        "info": {"a_info": {"x": "1", "y": "two words"}, "b_info": {"quoted": 'say "hi"'}},
        "process_start_time_s": 12.5,
    }


def test_capacity_comes_from_what_the_server_exposes_and_its_arguments_are_unknown() -> None:
    with running(FakeEndpoint()) as url:
        facts = endpoint.attach_facts(url, "served")
    cap = endpoint.capacity_facts(facts)
    assert cap["launched"] is False and cap["kv_cache_tokens"] == 8704
    assert cap["max_concurrency"] == 8.5 and cap["max_concurrency_tokens_per_request"] == 1024
    assert cap["non_default_args"] is None and cap["max_num_seqs"] is None
    assert cap["version"] is None and cap["version_endpoint"] == "0.32.0"
    assert (cap["url"], cap["served_model"], cap["max_model_len"]) == (url, "served", 1024)
    # blocks x block size when the server does not give the tokens
    del facts["server_info"]["vllm:cache_config_info"]["kv_cache_size_tokens"]
    assert endpoint.capacity_facts(facts)["kv_cache_tokens"] == 68 * 128


# --- the model stage ---------------------------------------------------------------------------


def test_the_model_stage_builds_nothing_and_records_the_served_model(tmp_path: Path) -> None:
    from servelab.workload.synthetic import vocab_ids

    with running(FakeEndpoint()) as url:
        exp = validate(endpoint_config(url))
        record = build_model(exp.model, tmp_path / "model", say=quiet, runtime=exp.runtime)
    on_disk = read_json(tmp_path / "model" / "servelab-model.json")
    assert on_disk == record and sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "servelab-model.json"
    ]
    assert record["source"] == "endpoint" and record["revision"] is None
    assert record["files"] == {} and record["model"]["root"] == "/models/served"
    # the words of the built-in corpus the server tokenizes as one token each
    assert len(record["vocab_ids"]) >= 50 and record["vocab_ids"] == sorted(record["vocab_ids"])
    assert vocab_ids(tmp_path / "model") == record["vocab_ids"]


def test_the_model_stage_fails_on_a_model_the_server_does_not_serve(tmp_path: Path) -> None:
    with running(FakeEndpoint()) as url:
        exp = validate(endpoint_config(url, served="nope"))
        with pytest.raises(ServelabError, match="^runtime.served_model: 'nope' is not served"):
            build_model(exp.model, tmp_path / "model", say=quiet, runtime=exp.runtime)


# --- the session: nothing started, nothing stopped -----------------------------------------------


def test_serve_attaches_to_the_server_and_records_it_not_launched(make_job: Any) -> None:
    with running(FakeEndpoint()) as url:
        job = make_job(validate(endpoint_config(url)).to_dict())
        launch = build_launch(job, "endpoint", port=0)
        assert launch.endpoint == url and launch.base_url == url and launch.command() == []
        log = job.paths.server_log("endpoint")
        with serve(launch, log, job.exp.server, quiet) as session:
            assert isinstance(session.server, EndpointServer) and not session.server.launched
            assert session.ready_s == 0.0 and session.startup_log() == ""
            assert session.max_model_len() == 1024
            assert session.lock["path"] and session.server.alive()
            cap = session.capacity({})
            record = session.launch_record(1, "endpoint", {}, job.runtime)
        assert session.server.alive()  # left running
    assert not log.exists()  # no log of servelab's
    assert record["launched"] is False and "start" not in record
    assert (record["command"], record["env"], record["args"]) == ([], {}, {})
    assert (record["host"], record["port"], record["ready_s"]) == ("127.0.0.1", launch.port, 0)
    assert record["placement"] == {"engine_nice": 0, "engine_pids": []}
    facts = record["endpoint"]
    assert facts["url"] == url and facts["model"]["max_model_len"] == 1024
    # the fake serves from this very process: a local server, found by its port
    import os

    assert record["pid"] == os.getpid() and facts["process"]["pid"] == os.getpid()
    assert cap["launched"] is False and cap["kv_cache_tokens"] == 8704
    LaunchRecord.from_json(record, Path("launch.json"))  # as its schema says
    CapacityRecord.from_json({**cap, "server_config": "endpoint"}, Path("capacity.json"))
    # a server that stopped answering is gone, and says how
    assert not session.server.alive()
    assert session.server.gone_text() == f"stopped answering at {url}"


def test_serve_fails_in_one_line_when_the_server_serves_another_model(make_job: Any) -> None:
    with running(FakeEndpoint(models=[model_entry("x")])) as url:
        job = make_job(validate(endpoint_config(url)).to_dict())
        launch = build_launch(job, "endpoint", port=0)
        with (
            pytest.raises(ServelabError, match="^runtime.served_model: 'served' is not served"),
            serve(launch, job.paths.server_log("endpoint"), job.exp.server, quiet),
        ):
            pass


def test_a_sweep_measures_the_running_server(make_job: Any, tmp_path: Path) -> None:
    """The sweep over an endpoint: every point measured, its records say what the server
    said, the server's CPU sampled from the process that listens on its port."""
    from servelab.measure.sweep import run_sweep

    fake = FakeEndpoint()
    with running(fake) as url:
        cfg = endpoint_config(
            url,
            workload={"input_tokens": 4, "output_tokens": 3, "waves": 1, "warmup": {"requests": 2}},
            telemetry={"cpu_hz": 20, "metrics_hz": 5},
            # points of a few ms beside the other tests: one the contention check flags is not
            # measured again, so the requests are the plan's (re-measures: tests/test_remeasure.py)
            analysis={"validity": {"remeasure": 0}},
        )
        exp = validate(cfg)
        build_model(exp.model, tmp_path / "model", say=quiet, runtime=exp.runtime)
        runtime = ensure_runtime(exp.runtime, exp.profile, None, quiet)
        job = make_job(exp.to_dict(), runtime=runtime)
        run = run_sweep(job, "endpoint")
        assert fake.asked.count("/v1/completions") == 2 + 1 + 2
    assert run["status"] == "complete" and run["points"] == 2 and run["launches"] == 1
    launch = LaunchRecord.read(job.paths.launch("endpoint"))
    assert launch.get("launched") is False and launch.get("endpoint")["url"] == url
    assert CapacityRecord.read(job.paths.capacity("endpoint")).get("launched") is False
    for pj in job.paths.point_files():
        point = PointRecord.read(pj).doc
        assert point["failed"] == 0 and point["num_prompts"] == point["concurrency"]
        cpu = point["telemetry"]["cpu"]
        assert cpu["server_error"] is None and cpu["server_cpu_pct"]["mean"] is not None
        assert "absent" not in point["telemetry"]["server"]  # /metrics scraped
    assert job.paths.prompts("endpoint").read_bytes()  # built with the server's /tokenize
    # the report says which server was measured, and that servelab did not launch it
    from servelab.analysis.pipeline import analyze

    analyze(job.paths.root, job.paths.analysis, exp.analysis, figures=False)
    report = (job.paths.analysis / "report.md").read_text(encoding="utf-8")
    assert (
        f"- Server (endpoint): the running server at {url}, not launched by servelab (on this "
        "host): vLLM 0.32.0 serving served (max_model_len 1024); its arguments, runtime and "
        "model files are not pinned." in report
    )


def test_an_endpoint_launch_takes_no_additions(make_job: Any) -> None:
    from servelab.launch.session import LaunchAdditions

    job = make_job(validate(endpoint_config()).to_dict())
    with pytest.raises(ServelabError, match="^profile.enabled: the profiling pass cannot"):
        build_launch(job, "endpoint", port=0, additions=LaunchAdditions(args=("--x",)))


def test_the_runtime_record_s_schema_takes_an_endpoint() -> None:
    from servelab.store.records import RuntimeRecord

    with running(FakeEndpoint()) as url:
        record = endpoint.probe(url, "served")
    RuntimeRecord.from_json(json.loads(json.dumps(record)), Path("runtime.json"))
    Experiment.from_dict(validate(endpoint_config(url)).to_dict())


def _measured(tmp_path: Path, url: str, make_job: Any, **sections: Any) -> Any:
    """The measuring job of an endpoint experiment on the fake at `url`, its model and runtime
    stages run."""
    cfg = endpoint_config(
        url,
        workload={"input_tokens": 4, "output_tokens": 2, "waves": 1, "warmup": {"requests": 0}},
        telemetry={"enabled": False},
        **sections,
    )
    exp = validate(cfg)
    build_model(exp.model, tmp_path / "model", say=quiet, runtime=exp.runtime)
    runtime = ensure_runtime(exp.runtime, exp.profile, None, quiet)
    return make_job(exp.to_dict(), runtime=runtime)


def test_sequential_rounds_measure_the_running_server(make_job: Any, tmp_path: Path) -> None:
    from servelab.measure.sequential import run_rounds

    with running(FakeEndpoint()) as url:
        job = _measured(
            tmp_path,
            url,
            make_job,
            sweep={"concurrency": [1, 2], "repeats": {"min": 2, "max": 3}},
            analysis={"claims": ["throughput[config=endpoint,c=2] > 0"]},
        )
        record = run_rounds(job)
    assert record["rounds"] >= 2 and record["launches"]
    launch = LaunchRecord.read(job.paths.launch("endpoint"))
    assert launch.get("launched") is False and launch.launch == len(record["launches"])


def test_the_slo_search_measures_the_running_server(make_job: Any, tmp_path: Path) -> None:
    from servelab.measure.slo_search import run_search

    search = {
        "enabled": True,
        "start_rate": 4,
        "max_measurements": 2,
        "max_rate": 8,
        "arrival": {"duration_s": 0.5},
    }
    with running(FakeEndpoint()) as url:
        job = _measured(
            tmp_path,
            url,
            make_job,
            sweep={"concurrency": [1], "repeats": 1},
            search=search,
            analysis={"slo": {"p99_ttft_ms": 5000}},
        )
        result = run_search(job, "endpoint")
    assert len(result["path"]) >= 1
    # 2 requests a point, 1 repeat a round: never enough for a p99 SLO, so the first rate is
    # measured in every round of search.max_rounds (3), as rep01-rep03, and counts as not
    # meeting
    first = result["path"][0]
    assert (first["rounds"], first["decision"], len(first["repeats"])) == (3, "undecided", 3)
    folder = f"r{first['rate']:08.3f}"
    reps = [
        job.paths.search("endpoint") / f"rep{r:02d}" / folder / "point.json" for r in range(1, 5)
    ]
    assert [p.exists() for p in reps] == [True, True, True, False]
    assert first["rate"] in result["answer"]["undecided_rates"]
    assert result["answer"]["met_rate"] is None
    launch = LaunchRecord.read(job.paths.search("endpoint") / LaunchRecord.FILE)
    assert launch.get("launched") is False and launch.get("command") == []


def test_the_settings_a_server_says_of_itself_stand_for_its_arguments() -> None:
    """What the validity checks read from a configuration's arguments comes, for a server
    servelab did not launch, from its /metrics info labels: prefix caching as it says it, and
    nothing it does not say."""
    from servelab.store.rawdata import said_args

    def block(value: str | None) -> dict:
        labels = {"block_size": "128"} | ({} if value is None else {"enable_prefix_caching": value})
        return {"server_info": {"vllm:cache_config_info": labels}}

    assert said_args(block("True")) == {"enable-prefix-caching": True}
    assert said_args(block("False")) == {"enable-prefix-caching": False}
    assert said_args(block(None)) == {} and said_args(block("maybe")) == {}
    assert said_args(None) == {} and said_args({}) == {}
