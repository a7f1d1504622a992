"""Which JSON Schema each file of a bundle satisfies, and validation that names file and path."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path

from servelab.errors import ServelabError
from servelab.store.jsonio import json_path, load_schema
from servelab.store.paths import (
    ARRIVALS_DIR,
    CAPACITY_FILE,
    CAPTURE_FILE,
    CLIENT_FILE,
    CLIENTS_DIR,
    CLIENTS_FILE,
    DATASET_FILE,
    LAUNCH_FILE,
    POINT_FILE,
    PROFILE_FILE,
    RUN_FILE,
    RUNTIME_FILE,
    SEARCH_DIR,
    SEARCH_FILE,
    TRACE_FILE,
    WINDOWS_FILE,
)

__all__ = [
    "RULES",
    "FOREIGN",
    "foreign",
    "schema_for",
    "load_schema",
    "schema_id",
    "validate_file",
    "check_all_json",
]

# bundle path pattern -> schema name (src/servelab/schemas/<name>.schema.json); first match wins
RULES: list[tuple[str, str]] = [
    ("manifest.json", "manifest"),
    ("provenance.json", "provenance"),
    ("attestation.intoto.json", "intoto"),
    (f"raw/*/rep*/c*/{POINT_FILE}", "point"),
    (f"raw/*/rep*/r*/{POINT_FILE}", "point"),
    (f"raw/*/{ARRIVALS_DIR}/r*.json", "arrivals"),
    (f"raw/*/{SEARCH_DIR}/rep*/r*/{POINT_FILE}", "point"),
    (f"raw/*/{SEARCH_DIR}/warmup/{POINT_FILE}", "point"),
    (f"raw/*/{SEARCH_DIR}/{ARRIVALS_DIR}/r*.json", "arrivals"),
    (f"raw/*/{SEARCH_DIR}/{CAPACITY_FILE}", "capacity"),
    (f"raw/*/{SEARCH_DIR}/{LAUNCH_FILE}", "launch"),
    (f"raw/*/{SEARCH_DIR}/{SEARCH_FILE}", "search"),
    (f"raw/*/warmup/{POINT_FILE}", "point"),
    (f"raw/*/{DATASET_FILE}", "dataset"),
    (f"raw/*/{SEARCH_DIR}/{DATASET_FILE}", "dataset"),
    (f"raw/*/{TRACE_FILE}", "trace"),
    (f"raw/*/{SEARCH_DIR}/{TRACE_FILE}", "trace"),
    (f"raw/*/{RUN_FILE}", "run"),
    (f"raw/*/{CLIENTS_DIR}/*/rep_*/concurrency_*/{CLIENT_FILE}", "client_run"),
    (f"runtime/{CLIENTS_FILE}", "clients"),
    (f"server/*/{CAPACITY_FILE}", "capacity"),
    (f"server/*/{LAUNCH_FILE}", "launch"),
    (f"runtime/{RUNTIME_FILE}", "runtime"),
    (f"runtime/*/{RUNTIME_FILE}", "runtime"),
    ("model/servelab-model.json", "model"),
    ("tables/knee.json", "knee"),
    ("tables/diagnoses.json", "diagnoses"),
    ("tables/claims.json", "claims"),
    ("tables/validity.json", "validity"),
    ("tables/slo.json", "slo"),
    ("tables/rounds.json", "rounds"),
    ("tables/turns.json", "turns"),
    ("tables/confirmation.json", "confirmation"),
    ("tables/same_host.json", "same_host"),
    (f"profile/*/{PROFILE_FILE}", "profile"),
    (f"profile/*/{WINDOWS_FILE}", "windows"),
    (f"profile/*/{CAPTURE_FILE}", "capture"),
]
# JSON files whose format is someone else's standard, validated by its own tools
FOREIGN = {"ro-crate-metadata.json": "ro-crate 1.3"}
# JSON files other benchmark tools wrote (client.cross_check), each read by its adapter in
# servelab.analysis.peers, which pins the tool's version; by path pattern
FOREIGN_PATTERNS = {
    f"raw/*/{CLIENTS_DIR}/*/rep_*/*": "another benchmark tool's own output (docs/analysis.md)",
}


def foreign(path: str) -> str | None:
    """What a JSON file in someone else's format is (None: servelab's own)."""
    if path in FOREIGN:
        return FOREIGN[path]
    return next((v for k, v in FOREIGN_PATTERNS.items() if fnmatchcase(path, k)), None)


def schema_for(path: str) -> str | None:
    for pattern, name in RULES:
        if fnmatchcase(path, pattern):
            return name
    return None


def schema_id(name: str) -> str:
    return str(load_schema(name)["$id"])


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
            f"{label}: {json_path(err.absolute_path)}: {err.message} (schema {schema['$id']})"
        )


def check_all_json(root: Path, paths: list[str]) -> list[str]:
    """Validate every JSON file under root; return one line per failure."""
    failures = []
    for rel in paths:
        if not rel.endswith(".json"):
            continue
        name = schema_for(rel)
        if name is None and foreign(rel) is not None:
            continue
        if name is None:
            failures.append(f"{rel}: no schema is registered for this JSON file")
            continue
        try:
            validate_file(root / rel, name, rel)
        except ServelabError as exc:
            failures.append(str(exc))
    return failures
