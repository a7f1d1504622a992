from __future__ import annotations

import re
from pathlib import Path

from servelab.config import load_schema


def key_paths(node: dict, prefix: str = "") -> list[str]:
    out = []
    for name, sub in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        out.append(path)
        if sub.get("type") == "object":
            out += key_paths(sub, path)
        items = sub.get("items")
        if sub.get("type") == "array" and isinstance(items, dict) and items.get("properties"):
            out += key_paths(items, path + "[]")
        for alt in sub.get("oneOf", []):  # e.g. sweep.repeats: a number or a plan
            out += key_paths(alt, path)
    return out


def test_every_config_key_is_documented(repo: Path) -> None:
    schema = load_schema(
        repo / "src" / "servelab" / "schemas" / "config.schema.yaml"
    )  # $refs inlined
    doc = (repo / "docs" / "config.md").read_text()
    missing = [k for k in key_paths(schema) if f"`{k}`" not in doc]
    assert not missing, f"docs/config.md lacks: {missing}"


def test_every_schema_property_has_type_description_default(repo: Path) -> None:
    schema = load_schema(
        repo / "src" / "servelab" / "schemas" / "config.schema.yaml"
    )  # $refs inlined

    def check(node: dict, path: str) -> list[str]:
        bad = []
        # required, or required by one of the alternatives (sweep: concurrency or rate)
        required = set(node.get("required", [])).union(
            *(alt.get("required", []) for alt in node.get("anyOf", []))
        )
        for name, sub in node.get("properties", {}).items():
            p = f"{path}.{name}" if path else name
            if "type" not in sub or "description" not in sub:
                bad.append(p)
            if "default" not in sub and name not in required:
                bad.append(p + " (no default)")
            if sub.get("type") == "object":
                bad += check(sub, p)
            if isinstance(sub.get("items"), dict):
                bad += check(sub["items"], p + "[]")
            for alt in sub.get("oneOf", []):
                bad += check(alt, p)
        return bad

    assert check(schema, "") == []


def test_experiment_configs_are_valid(repo: Path) -> None:
    """Valid, or (with "<set: ...>" values left for the user to pin) refused in one line that
    names them; with them filled in, valid too."""
    import pytest

    from servelab.config import load, placeholders, read_file, validate
    from servelab.errors import ServelabError

    for path in sorted((repo / "config" / "experiments").glob("*.yaml")):
        raw = read_file(path)  # an overlay with the file it extends
        todo = placeholders(raw)
        if not todo:
            assert load(path).name == path.stem
            continue
        with pytest.raises(ServelabError, match="not pinned: set ") as err:
            load(path)
        assert all(key in str(err.value) for key, _ in todo) and "\n" not in str(err.value)
        filled = {
            "model.repo": "org/model",
            "model.revision": "0" * 40,
            "runtime.image": "localhost/servelab-vllm-cpu:0123456789abcdef@sha256:" + "0" * 64,
        }
        for key, _ in todo:
            section, name = key.split(".")
            raw[section][name] = filled[key]
        assert validate(raw, str(path)).name == path.stem


def test_every_cli_command_is_documented(repo: Path) -> None:
    from servelab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    names = []
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        names += [f"{name} {n}" for n in nested[0].choices] if nested else [name]
    doc = (repo / "docs" / "cli.md").read_text()
    assert [n for n in names if f"## {n}\n" not in doc] == []
    assert len(names) >= 10


def test_the_measuring_job_group_is_documented_rule_by_rule(repo: Path) -> None:
    """docs/architecture.md names every rule of the job group measure-<experiment> (the rules
    whose `group:` is MEASURE_GROUP), and no other rule as part of it."""
    grouped = set()
    for smk in sorted((repo / "rules").glob("*.smk")):
        rule = None
        lines = smk.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^rule (\w+):", line)
            if m:
                rule = m.group(1)
            if line.strip() == "group:" and rule and "MEASURE_GROUP" in lines[i + 1]:
                grouped.add(rule)
    assert {"runtime", "sweep", "slo_search", "profile"} <= grouped
    text = " ".join((repo / "docs" / "architecture.md").read_text().split())
    end = text.find(" form the job group `measure-<experiment>`")
    start = text.rfind("(rules named `exp_<experiment>_<rule>`).", 0, end)
    assert 0 <= start < end, "docs/architecture.md: the sentence naming the measuring job group"
    named = set(re.findall(r"`(\w+)`", text[start:end].split(").", 1)[1]))
    assert named == grouped, f"documented {sorted(named)}, in the rules {sorted(grouped)}"


def rule_scripts(repo: Path) -> dict[str, str | None]:
    """Every rule of rules/*.smk and the script it runs (scripts/X.py; None for a shell rule)."""
    rules: dict[str, str | None] = {}
    rule = None
    for smk in sorted((repo / "rules").glob("*.smk")):
        for line in smk.read_text().splitlines():
            m = re.match(r"^rule (\w+):", line)
            if m:
                rule = m.group(1)
                rules[rule] = None
            m = re.match(r'^\s+"\.\./(scripts/\w+\.py)"', line)
            if m and rule:
                rules[rule] = m.group(1)
    return rules


def test_every_rule_is_in_the_architecture_table_with_its_script(repo: Path) -> None:
    """docs/architecture.md's table of rules has a row for every rule of rules/*.smk (the
    Snakefile's `all` aside), naming the script it runs, and names no rule that is not there."""
    rules = rule_scripts(repo)
    assert {"analysis", "slo_search", "sweep_profile", "site"} <= set(rules)
    assert rules["slo_search"] == "scripts/search.py" and rules["site"] is None
    text = (repo / "docs" / "architecture.md").read_text()
    table = text.split("| rule | script | library | writes |\n", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[1:]]
    documented: dict[str, set[str]] = {}
    for row in rows:
        name = re.match(r"`(\w+)`", row[0])
        assert name, f"docs/architecture.md: a row without its rule: {row[0]}"
        documented.setdefault(name.group(1), set()).add(row[1])
    assert sorted(set(documented) - set(rules)) == [], "documented rules that do not exist"
    assert sorted(set(rules) - set(documented)) == [], "rules without a row"
    wrong = {r: s for r, s in rules.items() if s is not None and s not in documented[r]}
    assert wrong == {}, f"rules whose row names another script: {wrong}"


def test_no_snakefile_trips_the_linters_mixed_rules_and_functions_check(repo: Path) -> None:
    """`snakemake --lint` (run by .ci/run, which fails on any lint but the conda one) flags a
    snakefile that both defines a function and matches its `rule .+?:` pattern, which a comment
    such as "its rule (see ...): ..." also matches. The patterns are read from snakemake itself."""
    import inspect

    from snakemake.linting.snakefiles import SnakefileLinter

    params = inspect.signature(SnakefileLinter.lint_mixed_func_and_rules).parameters
    rule_re, func_re = params["rule_regex"].default, params["func_regex"].default
    paths = [repo / "Snakefile", *sorted((repo / "rules").glob("*.smk"))]
    mixed = [
        f"{p.relative_to(repo)}: {rule_re.search(p.read_text()).group(0)!r}"
        for p in paths
        if func_re.search(p.read_text()) and rule_re.search(p.read_text())
    ]
    assert mixed == [], f"snakefiles with functions whose text matches 'rule ...:': {mixed}"
