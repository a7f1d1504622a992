"""Experiment configuration: YAML validated against config/schema/config.schema.yaml.

Defaults come from the schema, so the schema is the one place where a key, its type, its
default and its description live. Errors name the file, the key path and what is allowed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from servelab.errors import ServelabError

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "config" / "schema" / "config.schema.yaml"


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ServelabError(f"{path}: not valid YAML{where}") from None


def key_path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _apply_defaults(schema: dict[str, Any], data: Any) -> Any:
    """Fill missing properties from schema defaults, recursing into objects and array items."""
    if isinstance(data, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in data and "default" in sub:
                data[name] = copy.deepcopy(sub["default"])
            if name in data:
                data[name] = _apply_defaults(sub, data[name])
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        return [_apply_defaults(schema["items"], item) for item in data]
    return data


def validate(
    config: Any, source: str = "config", schema_path: Path = SCHEMA_PATH
) -> dict[str, Any]:
    """Validate; return a copy with defaults filled in. Raise ServelabError on the first error."""
    import jsonschema

    schema = load_yaml(schema_path)
    data = _apply_defaults(schema, copy.deepcopy(config) if config is not None else {})
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        validator.iter_errors(data), key=lambda e: (len(e.path), list(map(str, e.path)))
    )
    if errors:
        err = errors[0]
        raise ServelabError(f"{source}: {key_path(err.absolute_path)}: {_describe(err)}")
    _check_semantics(data, source)
    return dict(data)


def _describe(err: Any) -> str:
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        return f"{err.message}; allowed keys: {', '.join(allowed)}" if allowed else err.message
    if err.validator == "enum":
        return f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
    return str(err.message)


def _check_semantics(cfg: dict[str, Any], source: str) -> None:
    names = [c["name"] for c in cfg["server"]["configs"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ServelabError(
            f"{source}: server.configs: name {dupes[0]!r} is used twice; names must differ"
        )
    reserved = {"host", "port", "model", "served-model-name"}
    for where, args in [("server.args", cfg["server"]["args"])] + [
        (f"server.configs[{i}].args", c["args"]) for i, c in enumerate(cfg["server"]["configs"])
    ]:
        for key in args:
            if key.startswith("-") or "_" in key:
                raise ServelabError(
                    f"{source}: {where}.{key}: write vLLM arguments without dashes and with "
                    f"hyphens, e.g. {key.lstrip('-').replace('_', '-')}"
                )
            if key in reserved:
                raise ServelabError(
                    f"{source}: {where}.{key}: servelab sets --{key} itself; remove it"
                )
    from servelab.analysis.claims_syntax import parse_claim

    for where in ("analysis", "reproduction"):
        for i, claim in enumerate(cfg[where]["claims"]):
            try:
                parse_claim(claim)
            except ServelabError as exc:
                raise ServelabError(f"{source}: {where}.claims[{i}]: {exc}") from None
    ref = cfg.get("reference")
    if ref is not None and not Path(ref).exists():
        raise ServelabError(
            f"{source}: reference: {ref!r} not found (relative to {Path.cwd()}); give a release "
            "folder evidence/<experiment>/<tag>, its .tar.gz or a bundle folder"
        )
    wu = cfg["workload"]
    model_len = cfg["server"]["args"].get("max-model-len")
    if isinstance(model_len, int) and wu["input_tokens"] + wu["output_tokens"] > model_len:
        raise ServelabError(
            f"{source}: workload: input_tokens + output_tokens = "
            f"{wu['input_tokens'] + wu['output_tokens']} exceeds "
            f"server.args.max-model-len {model_len}"
        )


def load(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = load_yaml(path)
    if overrides:
        raw = merge(raw or {}, overrides)
    return validate(raw, str(path))


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def server_args(cfg: dict[str, Any], server_config: str) -> dict[str, Any]:
    """Resolved vLLM arguments of one server configuration (shared args, then its own)."""
    for c in cfg["server"]["configs"]:
        if c["name"] == server_config:
            return {**cfg["server"]["args"], **c["args"]}
    raise ServelabError(f"server config {server_config!r} is not in server.configs")


def args_to_cli(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in sorted(args.items()):
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out.append(f"--no-{key}")
        else:
            out += [f"--{key}", str(value)]
    return out
