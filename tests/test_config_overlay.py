"""Experiment files as overlays (docs/config.md, "Overlays"): a file with `extends:` holds what
differs from the file it names; servelab's readers (servelab.config.read_file: `load`, the
campaign, rules/common.smk under `snakemake --configfile`) all lay it over that file the same
way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from workflow_env import snakemake_env

from servelab import config
from servelab.campaign import load_campaign
from servelab.errors import ServelabError

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "config" / "experiments"


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_an_overlay_merges_mappings_replaces_lists_and_removes_nulls(tmp_path: Path) -> None:
    write(
        tmp_path / "base.yaml",
        {
            "experiment": "base",
            "server": {"args": {"a": 1, "b": 2}, "configs": [{"name": "x"}, {"name": "y"}]},
            "sweep": {"concurrency": [1, 2], "repeats": 3},
        },
    )
    over = {
        "extends": "base.yaml",
        "experiment": "over",
        "server": {"args": {"b": None, "c": 3}, "configs": [{"name": "z"}]},
        "sweep": {"concurrency": None, "rate": [1]},
        "workload": {"dataset": {"path": "d", "output_tokens": None}},
    }
    got = config.read_file(write(tmp_path / "over.yaml", over))
    assert got == {
        "experiment": "over",
        "server": {"args": {"a": 1, "c": 3}, "configs": [{"name": "z"}]},
        "sweep": {"repeats": 3, "rate": [1]},
        "workload": {"dataset": {"path": "d"}},
    }


def test_overlays_chain_relative_to_their_own_folders(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", {"experiment": "a", "workload": {"waves": 1, "seed": 1}})
    write(tmp_path / "b" / "b.yaml", {"extends": "../a.yaml", "experiment": "b",
                                      "workload": {"waves": 2}})  # fmt: skip
    c = write(tmp_path / "c.yaml", {"extends": "b/b.yaml", "experiment": "c"})
    assert config.read_file(c) == {"experiment": "c", "workload": {"waves": 2, "seed": 1}}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"o.yaml": {"extends": "gone.yaml", "experiment": "o"}}, "o.yaml: extends: .*gone.yaml: "
         "file not found; give the experiment file this one overlays"),
        ({"o.yaml": {"extends": ["b.yaml"], "experiment": "o"}}, r"o.yaml: extends: \['b.yaml'\] "
         "is not a file name"),
        ({"o.yaml": {"extends": "p.yaml", "experiment": "o"},
          "p.yaml": {"extends": "o.yaml", "experiment": "p"}}, "extends: o.yaml leads back to"),
        ({"o.yaml": {"extends": "o.yaml", "experiment": "o"}}, "extends: o.yaml leads back to"),
        ({"o.yaml": {"extends": "b.yaml"}, "b.yaml": {"experiment": "b"}}, "o.yaml: experiment: "
         "an overlay names its own experiment .*; add experiment: NAME"),
        ({"o.yaml": {"extends": "b.yaml", "experiment": "o"}, "b.yaml": [1]}, "b.yaml: not a "
         "mapping of config keys"),
    ],
)  # fmt: skip
def test_a_bad_overlay_is_refused_in_one_line(
    tmp_path: Path, files: dict[str, Any], expected: str
) -> None:
    for name, data in files.items():
        write(tmp_path / name, data)
    with pytest.raises(ServelabError, match=expected) as err:
        config.read_file(tmp_path / "o.yaml")
    assert "\n" not in str(err.value)


def test_load_and_a_campaign_read_an_overlay(tmp_path: Path) -> None:
    sweep = EXPERIMENTS / "max-num-seqs-sweep.yaml"
    exp = config.load(sweep)
    assert exp.experiment == "max-num-seqs-sweep"
    assert [c.name for c in exp.server.configs] == [f"max-num-seqs-{n}" for n in (1, 2, 4, 8)]
    assert exp.server.args["num-gpu-blocks-override"] == 68  # config/config.yaml's
    campaign = write(tmp_path / "c.yaml", {"name": "c", "experiments": [str(sweep)]})
    (entry,) = load_campaign(campaign, REPO).experiments
    assert "extends" not in entry.config
    assert config.validate(entry.config).to_dict() == exp.to_dict()


def test_several_sources_merge_in_order_then_the_settings(tmp_path: Path) -> None:
    """read_sources, as the workflow reads --configfile A --configfile B --config K=V: each
    file (its overlays resolved) merged over the one before, then the settings on top."""
    a = write(tmp_path / "a.yaml", {"experiment": "a", "server": {"args": {"x": 1, "y": 2}}})
    b = write(tmp_path / "b.yaml", {"server": {"args": {"y": 3}}, "sweep": {"concurrency": [1]}})
    raw = config.read_sources([a, b], {"sweep": {"concurrency": [2, 4]}})
    assert raw == {
        "experiment": "a",
        "server": {"args": {"x": 1, "y": 3}},
        "sweep": {"concurrency": [2, 4]},
    }
    sweep = EXPERIMENTS / "max-num-seqs-sweep.yaml"  # extends ../config.yaml
    assert config.read_sources([sweep]) == config.read_file(sweep)
    listed = tmp_path / "l.yaml"
    listed.write_text("- 1\n")
    assert config.read_sources([listed]) == [1]  # one file as written: validate() names it
    with pytest.raises(ServelabError, match=r"l\.yaml: not a mapping of config keys"):
        config.read_sources([a, listed])


def test_every_nullable_key_defaults_to_null() -> None:
    """So a key an overlay sets to null, removed and given the schema's default, is null
    wherever null is allowed (docs/config.md, "Overlays")."""
    schema = config.load_schema()  # $refs inlined
    wrong = []

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        types = node.get("type")
        nullable = "null" in (types if isinstance(types, list) else [types])
        if nullable and node.get("default", None) is not None:
            wrong.append(path)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)
        walk(node.get("items"), f"{path}[]")
        for sub in node.get("oneOf", []) + node.get("anyOf", []):
            walk(sub, path)

    walk(schema, "")
    assert wrong == []


SNAKEFILE = f"""
configfile: "config/config.yaml"
include: "{REPO / "rules" / "common.smk"}"
import json as _json
print("RESOLVED=" + _json.dumps(config, sort_keys=True))
rule nothing:
    output: []
"""


@pytest.mark.parametrize(
    ("example", "overrides"),
    [("max-num-seqs-sweep", {"experiment": "overlay-check"}), ("open-loop-rate-cpu", {})],
)
def test_snakemake_reads_an_overlay_as_servelab_does(
    tmp_path: Path, example: str, overrides: dict[str, str]
) -> None:
    """rules/common.smk under --configfile (and --config) resolves what config.read_file reads:
    config/config.yaml's keys under the overlay's, a null removing one."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(SNAKEFILE, encoding="utf-8")
    path = EXPERIMENTS / f"{example}.yaml"
    cmd = ["snakemake", "-n", "--nolock", "--cores", "1", "--snakefile", str(snakefile)]
    cmd += ["-d", str(REPO), "--configfile", str(path)]
    cmd += ["--config", *(f"{k}={v}" for k, v in overrides.items())] if overrides else []
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, env=snakemake_env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESOLVED=")]
    expected = config.validate(config.merge(config.read_file(path), overrides)).to_dict()
    assert json.loads(line.removeprefix("RESOLVED=")) == json.loads(json.dumps(expected))
