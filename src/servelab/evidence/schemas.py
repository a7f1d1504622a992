"""Which JSON Schema each file of a bundle satisfies, and validation that names file and path."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Any

from servelab.errors import ServelabError

# bundle path pattern -> schema name (src/servelab/schemas/<name>.schema.json); first match wins
RULES: list[tuple[str, str]] = [
    ("manifest.json", "manifest"),
    ("provenance.json", "provenance"),
    ("attestation.intoto.json", "intoto"),
    ("raw/*/rep*/c*/point.json", "point"),
    ("raw/*/warmup/point.json", "point"),
    ("raw/*/run.json", "run"),
    ("server/*/capacity.json", "capacity"),
    ("server/*/launch.json", "launch"),
    ("runtime/runtime.json", "runtime"),
    ("model/servelab-model.json", "model"),
    ("tables/knee.json", "knee"),
    ("tables/diagnoses.json", "diagnoses"),
    ("tables/claims.json", "claims"),
    ("tables/validity.json", "validity"),
    ("tables/slo.json", "slo"),
    ("profile/*/profile.json", "profile"),
    ("profile/*/windows.json", "windows"),
    ("profile/*/capture.json", "capture"),
]
# JSON files whose format is someone else's standard, validated by its own tools
FOREIGN = {"ro-crate-metadata.json": "ro-crate 1.3"}


def schema_for(path: str) -> str | None:
    for pattern, name in RULES:
        if fnmatchcase(path, pattern):
            return name
    return None


def load_schema(name: str, version: int | None = None) -> dict[str, Any]:
    """The schema `name` (src/servelab/schemas/<name>.schema.json); with `version`, the schema
    of that format version of the document when it is not the current one
    (<name>.v<version>.schema.json, kept so that older bundles still verify)."""
    files = resources.files("servelab").joinpath("schemas")
    text = files.joinpath(f"{name}.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    current = schema.get("properties", {}).get("format_version", {}).get("const")
    if version is not None and current is not None and version != current:
        older = files.joinpath(f"{name}.v{version}.schema.json")
        if older.is_file():
            schema = json.loads(older.read_text("utf-8"))
    return schema


def schema_id(name: str) -> str:
    return str(load_schema(name)["$id"])


def _json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def validate_file(path: Path, name: str, label: str) -> None:
    import jsonschema

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ServelabError(f"{label}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    version = data.get("format_version") if isinstance(data, dict) else None
    schema = load_schema(name, version if isinstance(version, int) else None)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        err = errors[0]
        raise ServelabError(
            f"{label}: {_json_path(err.absolute_path)}: {err.message} (schema {schema['$id']})"
        )


def check_all_json(root: Path, paths: list[str]) -> list[str]:
    """Validate every JSON file under root; return one line per failure."""
    failures = []
    for rel in paths:
        if not rel.endswith(".json") or rel in FOREIGN:
            continue
        name = schema_for(rel)
        if name is None:
            failures.append(f"{rel}: no schema is registered for this JSON file")
            continue
        try:
            validate_file(root / rel, name, rel)
        except ServelabError as exc:
            failures.append(str(exc))
    return failures
