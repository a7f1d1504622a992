from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from workflow_env import config_errors

from servelab import config
from servelab.errors import ServelabError


def minimal() -> dict:
    return {
        "experiment": "t",
        "model": {"source": "tiny"},
        "runtime": {"kind": "venv"},
        "server": {"configs": [{"name": "a"}]},
        "workload": {},
        "sweep": {"concurrency": [1, 2]},
    }


def test_default_config_is_valid_and_defaults_fill_in(repo: Path) -> None:
    cfg = config.load(repo / "config" / "config.yaml").to_dict()
    assert cfg["experiment"] == "quickstart-cpu"
    assert [c["name"] for c in cfg["server"]["configs"]] == ["max-num-seqs-1", "max-num-seqs-8"]
    assert cfg["server"]["port"] == 0  # from the schema's default
    assert cfg["sweep"]["order"] == "latin"
    assert cfg["workload"]["request_timeout_s"] == 300


def test_defaults_reach_array_items() -> None:
    cfg = config.validate(minimal()).to_dict()
    assert cfg["server"]["configs"][0]["args"] == {}
    assert cfg["model"]["tiny"]["hidden_size"] == 512  # the default experiment's


def test_unique_prompts_default_true_and_must_be_boolean() -> None:
    cfg = config.validate(minimal()).to_dict()
    assert cfg["workload"]["unique_prompts"] is True
    off = config.validate(
        config.merge(minimal(), {"workload": {"unique_prompts": False}})
    ).to_dict()
    assert off["workload"]["unique_prompts"] is False
    for bad in ("yes", 1, None):
        with pytest.raises(ServelabError) as err:
            config.validate(config.merge(minimal(), {"workload": {"unique_prompts": bad}}))
        assert "workload.unique_prompts" in str(err.value)
        assert "is not of type 'boolean'" in str(err.value)


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {"sweep": {"concurrency": [1, -2]}},
            "sweep.concurrency[1]: -2 is less than the minimum of 1",
        ),
        (
            {"sweep": {"concurrency": [1], "order": "zigzag"}},
            "sweep.order: 'zigzag' is not one of latin",
        ),
        ({"model": {"source": "tiny", "sourc": 1}}, "model: Additional properties are not allowed"),
        (
            {"server": {"configs": [{"name": "a b"}]}},
            "server.configs[0].name: 'a b' does not match",
        ),
        ({"server": {"configs": [{"name": "a"}, {"name": "a"}]}}, "name 'a' is used twice"),
        ({"server": {"configs": [{"name": "a", "args": {"max_num_seqs": 1}}]}}, "max-num-seqs"),
        (
            {"server": {"configs": [{"name": "a", "args": {"port": 1}}]}},
            "servelab sets --port itself",
        ),
        (
            {"server": {"args": {"max-model-len": 100}, "configs": [{"name": "a"}]}},
            "exceeds server.args.max-model-len 100",
        ),
    ],
)
def test_invalid_config_names_the_key(patch: dict, expected: str) -> None:
    with pytest.raises(ServelabError) as err:
        config.validate(config.merge(minimal(), patch), source="my.yaml")
    msg = str(err.value)
    assert msg.startswith("my.yaml: ")
    assert expected in msg
    assert "\n" not in msg


def test_args_to_cli_handles_flags() -> None:
    cli = config.args_to_cli(
        {"max-num-seqs": 8, "enable-prefix-caching": False, "enforce-eager": True}
    )
    assert cli == ["--no-enable-prefix-caching", "--enforce-eager", "--max-num-seqs", "8"]


def test_server_args_merge_config_over_shared(repo: Path) -> None:
    cfg = config.load(repo / "config" / "config.yaml")
    args = cfg.server.args_of("max-num-seqs-8")
    assert args["max-num-seqs"] == 8 and args["max-model-len"] == 1024


def test_snakemake_rejects_invalid_config_in_one_line(repo: Path, tmp_path: Path) -> None:
    bad = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    bad["sweep"]["concurrency"] = [1, 0]
    bad["results_dir"] = str(tmp_path / "results")
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(yaml.safe_dump(bad))
    errors = config_errors(cfg_file)
    assert len(errors) == 1, errors
    assert "sweep.concurrency[1]: 0 is less than the minimum of 1" in errors[0]
    assert str(cfg_file) in errors[0]
    assert not (tmp_path / "results").exists()  # nothing started
