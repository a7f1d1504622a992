"""Every example experiment resolves to exactly the config it resolved to before the examples
became overlays of config/config.yaml: tests/fixtures/resolved-configs/<name>.json holds each
one's resolved config (servelab.config's validate, as rules/common.smk calls it) as canonical
JSON, and the test compares byte for byte.

A value still to be pinned ("<set: ...>") is replaced by a fixed stand-in first, so that files
refused until their author pins them resolve too. To rewrite one baseline after a deliberate
change of what an example measures: python tests/test_config_baseline.py NAME."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from servelab import config

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "tests" / "fixtures" / "resolved-configs"
EXAMPLES = {
    "config": REPO / "config" / "config.yaml",
    **{p.stem: p for p in sorted((REPO / "config" / "experiments").glob("*.yaml"))},
}
# "<set: ...>" values, by key path: a stand-in that validates
STAND_INS = {
    "model.repo": "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "model.revision": "a" * 40,
    "runtime.image": "localhost/servelab-vllm-cpu:stand-in@sha256:" + "0" * 64,
}


def _pin(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _pin(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_pin(v, f"{path}[{i}]") for i, v in enumerate(node)]
    if config.placeholders(node):
        assert path in STAND_INS, f"{path}: a placeholder without a stand-in; add one to STAND_INS"
        return STAND_INS[path]
    return node


def read_example(path: Path) -> Any:
    """The example as servelab reads it (an overlay over the file it extends), pinned."""
    return _pin(config.read_file(path))


def resolved_json(path: Path) -> str:
    resolved = config.validate(read_example(path), source=str(path)).to_dict()
    return json.dumps(resolved, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def test_every_example_has_a_baseline() -> None:
    assert sorted(p.stem for p in BASELINES.glob("*.json")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_resolves_as_its_baseline(name: str) -> None:
    baseline = (BASELINES / f"{name}.json").read_text(encoding="utf-8")
    assert resolved_json(EXAMPLES[name]) == baseline, (
        f"{EXAMPLES[name].relative_to(REPO)} no longer resolves as "
        f"tests/fixtures/resolved-configs/{name}.json; where the change is meant (a new schema "
        f"key, a changed example): python tests/test_config_baseline.py {name}"
    )


if __name__ == "__main__":
    BASELINES.mkdir(parents=True, exist_ok=True)
    for arg in sys.argv[1:] or sorted(EXAMPLES):
        (BASELINES / f"{arg}.json").write_text(resolved_json(EXAMPLES[arg]), encoding="utf-8")
        print(f"wrote {BASELINES / arg}.json")
