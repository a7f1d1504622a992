"""The workload keys of "Workloads from data" in the config (drawn lengths, a dataset, shared
prefixes, chat): what is refused, in one line, and what the resolved config holds; and the
refusal of a reference measured on another dataset."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from servelab.config import load_yaml, resolve, validate
from servelab.errors import ServelabError
from servelab.experiment import Lengths
from servelab.reproduce.comparison import _config_dataset, other_dataset

REPO = Path(__file__).resolve().parents[1]
BASE = load_yaml(REPO / "config" / "config.yaml")
SHA = "ab" * 32
HUB = {"repo_id": "servelab-test/chats", "filename": "chats.json", "revision": "0" * 40}


def _cfg(workload: dict[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(BASE)
    cfg["workload"] = workload
    return cfg


def _refused(workload: dict[str, Any]) -> str:
    with pytest.raises(ServelabError) as exc:
        validate(_cfg(workload))
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_the_default_workload_resolves_as_before() -> None:
    wl = resolve(_cfg({}))["workload"]
    assert sorted(wl) == [
        "client_workers", "ignore_eos", "input_tokens", "output_tokens", "record_output_ids",
        "request_timeout_s", "seed", "unique_prompts", "warmup", "waves",
    ]  # fmt: skip
    assert validate(_cfg({})).workload.fixed_lengths


def test_drawn_lengths() -> None:
    wl = validate(
        _cfg({"input_tokens": {"min": 8, "max": 64}, "output_tokens": {"values": [4, 16]}})
    ).workload
    assert wl.input_tokens == Lengths(8, 64, None) and wl.input_tokens.largest == 64
    assert wl.output_tokens == Lengths(None, None, (4, 16))
    assert wl.output_tokens.to_json() == {"values": [4, 16]} and not wl.fixed_lengths
    assert "min and max" in _refused({"input_tokens": {"min": 3, "max": 9, "values": [1]}})
    assert "max (5) is below min (30)" in _refused({"input_tokens": {"min": 30, "max": 5}})
    assert "{min: A, max: B}" in _refused({"output_tokens": {"min": 3}})


def test_lengths_must_fit_the_model() -> None:
    msg = _refused({"input_tokens": {"min": 8, "max": 900}, "output_tokens": 200})
    assert "= 1100 exceeds server.args.max-model-len 1024" in msg
    # a chat's last turn carries every earlier one, a shared prefix comes first
    msg = _refused({"input_tokens": 100, "output_tokens": 100, "chat": {"turns": 5},
                    "shared_prefix": {"prefixes": 2, "prefix_tokens": 64}})  # fmt: skip
    assert "shared_prefix.prefix_tokens + input_tokens + output_tokens over 5 chat turns" in msg
    assert "= 1064" in msg


def test_a_dataset_by_path_or_hub() -> None:
    wl = validate(_cfg({"dataset": {"path": "d.json", "sha256": SHA}})).workload
    assert wl.dataset is not None and wl.dataset.path == "d.json" and wl.dataset.hub is None
    assert wl.dataset.filter.min_input_tokens == 4 and wl.dataset.output_tokens is None
    # the dataset gives the lengths: the resolved config holds none
    assert wl.input_tokens is None and wl.output_tokens is None
    resolved = resolve(_cfg({"dataset": {"hub": HUB}}))["workload"]
    assert "input_tokens" not in resolved and resolved["dataset"]["hub"] == HUB
    assert "not both" in _refused({"dataset": {"path": "d.json", "sha256": SHA, "hub": HUB}})
    assert "remove input_tokens" in _refused({"dataset": {"hub": HUB}, "input_tokens": 64})
    assert "synthetic turns only" in _refused({"dataset": {"hub": HUB}, "chat": {"turns": 2}})


def test_a_dataset_path_without_its_sha256_is_refused_with_the_digest(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hi", "output_tokens": 4}\n', encoding="utf-8")
    msg = _refused({"dataset": {"path": str(f)}})
    assert "workload.dataset.sha256: required with path" in msg
    import hashlib

    assert f"sha256: {hashlib.sha256(f.read_bytes()).hexdigest()}" in msg


def test_a_reference_on_another_dataset_is_refused() -> None:
    ref = {"file": {"source": "path", "path": "datasets/a.json", "sha256": SHA}}
    assert _config_dataset(ref, {"path": "elsewhere/a.json", "sha256": SHA}) is None
    assert _config_dataset(None, None) is None
    why = _config_dataset(ref, {"path": "b.json", "sha256": "cd" * 32})
    assert why is not None and "not compared" in why and SHA[:12] in why and "cdcd" in why
    why = _config_dataset(None, {"path": "b.json", "sha256": SHA})
    assert why is not None and "synthetic prompts" in why
    why = _config_dataset(ref, None)
    assert why is not None and "this config samples synthetic prompts" in why
    hub_ref = {"file": {"source": "hub", **HUB, "sha256": SHA}}
    assert _config_dataset(hub_ref, {"hub": HUB}) is None
    assert _config_dataset(hub_ref, {"hub": {**HUB, "revision": "1" * 40}}) is not None
    # two bundles: the same file, or not
    assert other_dataset(ref, {"file": {**ref["file"], "path": "x"}}) is None
    why = other_dataset(ref, {"file": {"sha256": "ef" * 32, "path": "c.json"}})
    assert why is not None and "runs on different datasets are not compared" in why


def test_prompt_rows_and_a_rerun_on_another_dataset(tmp_path: Path) -> None:
    """prompts.jsonl.gz keeps a plain prompt's row as it always was, and what a Prompt or a
    Conversation asked; a rerun that would sample another dataset into the same results stops
    in one line and leaves the kept record as it was."""
    import gzip
    import json

    from servelab.client.prompt import Conversation, Prompt
    from servelab.workload.promptset import PromptSet, write_prompts

    items = [
        "plain",
        Prompt("drawn", max_tokens=8, input_tokens=5),
        Prompt("shared", max_tokens=4, input_tokens=9, prefix=1),
        Conversation((Prompt("q1", max_tokens=3), Prompt("q2", max_tokens=5)), "sys", 0),
    ]
    record = {"file": {"source": "path", "path": "d.json", "sha256": SHA}, "format": "sharegpt",
              "seed": 0, "output_tokens": None, "filter": {"min_input_tokens": 4}}  # fmt: skip
    prompts, dataset = tmp_path / "prompts.jsonl.gz", tmp_path / "dataset.json"
    write_prompts(prompts, dataset, PromptSet(items, record))
    with gzip.open(prompts, "rt") as fh:
        rows = [json.loads(line) for line in fh]
    assert rows == [
        {"index": 0, "prompt": "plain"},
        {"index": 1, "prompt": "drawn", "max_tokens": 8, "input_tokens": 5},
        {"index": 2, "prompt": "shared", "max_tokens": 4, "input_tokens": 9, "prefix": 1},
        {"index": 3, "system": "sys", "prefix": 0,
         "turns": [{"prompt": "q1", "max_tokens": 3}, {"prompt": "q2", "max_tokens": 5}]},
    ]  # fmt: skip
    kept = dataset.read_bytes()
    # the same dataset sampled again: fine; another file: refused
    write_prompts(prompts, dataset, PromptSet(items, dict(record)))
    other = {**record, "file": {**record["file"], "sha256": "cd" * 32}}
    with pytest.raises(ServelabError) as exc:
        write_prompts(prompts, dataset, PromptSet(items, other))
    assert "measured on another dataset (dataset sha256 abababababab vs cdcdcdcdcdcd)" in str(
        exc.value
    )
    assert dataset.read_bytes() == kept


def test_a_dataset_path_is_checked_against_its_pin_before_anything_starts(tmp_path: Path) -> None:
    """The workflow's start and `servelab check-config` refuse a file other than the pinned
    one; a hub dataset is left to the sweep, which downloads it."""
    import hashlib

    from servelab.cli import main
    from servelab.workload.datasets import check_local_pin

    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hi there", "output_tokens": 4}\n', encoding="utf-8")
    good = hashlib.sha256(f.read_bytes()).hexdigest()
    exp = validate(_cfg({"dataset": {"path": str(f), "sha256": good, "format": "jsonl"}}))
    found = check_local_pin(exp.workload.dataset)
    assert found is not None and found.sha256 == good
    assert check_local_pin(validate(_cfg({"dataset": {"hub": HUB}})).workload.dataset) is None
    assert check_local_pin(None) is None
    bad = validate(_cfg({"dataset": {"path": str(f), "sha256": SHA, "format": "jsonl"}}))
    with pytest.raises(ServelabError, match=f"sha256 is {good}, the config pins {SHA}"):
        check_local_pin(bad.workload.dataset)
    cfg = _cfg({"dataset": {"path": str(f), "sha256": SHA, "format": "jsonl"}})
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert main(["check-config", str(path)]) == 2
