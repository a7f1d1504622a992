"""Experiment configuration: YAML validated against schemas/config.schema.yaml (package data).

Defaults come from the schema, so the schema is the one place where a key, its type, its
default and its description live. Errors name the file, the key path and what is allowed.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import yaml

from servelab.documents import JsonObject, JsonValue
from servelab.env import endpoint, endpoint_config
from servelab.env.config_client import check_client
from servelab.env.config_runtime import check_config_runtimes, check_side_by_side, check_slices
from servelab.env.config_workload import (
    check_arrival,
    check_rates,
    check_sweep_axis,
    check_workload,
    check_workload_as_written,
    number,
)
from servelab.errors import ServelabError
from servelab.experiment import (
    Experiment,
    RuntimeSection,
    ServerSection,
    section_from_dict,
)
from servelab.store.jsonio import as_list, as_object

if TYPE_CHECKING:
    import jsonschema

_S = TypeVar("_S")

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"
# A value the config's author must fill in: "<set: HINT>", e.g. "<set: its 40-hex commit>".
PLACEHOLDER = re.compile(r"^<set:\s*(?P<hint>.+?)\s*>$", re.I)
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# The key of an experiment file that names the file it overlays (read_file)
EXTENDS = "extends"
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


# libyaml's parser where PyYAML was built with it (its wheels are): the same documents as the
# pure-Python SafeLoader, ten times sooner, and the schema is read by every workflow job
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> JsonValue:
    try:
        doc: JsonValue = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506
        return doc
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ServelabError(f"{path}: not valid YAML{where}") from None


def key_path(parts: Iterable[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


# a property's default where runtime.kind is endpoint (a server servelab did not launch), in
# place of its `default`: the schema holds both
ENDPOINT_DEFAULT = "x-endpoint-default"


def _properties(schema: JsonObject) -> dict[str, JsonObject]:
    """A schema object's `properties`: each property's schema by name."""
    return {name: as_object(sub) for name, sub in as_object(schema.get("properties", {})).items()}


def _apply_defaults(schema: JsonObject, data: JsonValue, endpoint: bool = False) -> JsonValue:
    """Fill missing properties from schema defaults (an endpoint config's own, ENDPOINT_DEFAULT,
    where a property has one), recursing into objects and array items."""
    items = schema.get("items")
    if isinstance(data, dict) and "properties" in schema:
        for name, sub in _properties(schema).items():
            key = ENDPOINT_DEFAULT if endpoint and ENDPOINT_DEFAULT in sub else "default"
            if name not in data and key in sub:
                data[name] = copy.deepcopy(sub[key])
            if name in data:
                data[name] = _apply_defaults(sub, data[name], endpoint)
    elif isinstance(data, list) and isinstance(items, dict):
        return [_apply_defaults(items, item, endpoint) for item in data]
    return data


def _defaults_of(schema: JsonObject, endpoint: bool = False) -> JsonObject:
    """An object of the schema `schema` with every property that has a default at it."""
    data: JsonObject = {}
    _apply_defaults(schema, data, endpoint)  # fills `data` in place
    return data


def load_schema(schema_path: Path = SCHEMA_PATH) -> JsonObject:
    """The config schema with each `$ref` to one of its `$defs` replaced by the definition (the
    referring node's own keys, its description or default, kept over the definition's): the
    form whose `properties` hold every key's default."""
    raw = as_object(load_yaml(schema_path))
    return dict(_inline_object(raw, as_object(raw.get("$defs", {}))))


def _inline_refs(node: JsonValue, defs: JsonObject) -> JsonValue:
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    return _inline_object(node, defs)


def _inline_object(node: JsonObject, defs: JsonObject) -> JsonObject:
    out = {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$ref", "$defs")}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return {**_inline_object(as_object(defs[ref.removeprefix("#/$defs/")]), defs), **out}
    return out


@functools.cache
def _schema(schema_path: Path = SCHEMA_PATH) -> JsonObject:
    return load_schema(schema_path)


def schema_defaults(*path: str) -> JsonObject:
    """The schema's defaults of the properties of the object at `path`, e.g.
    schema_defaults("analysis", "validity"): for code that runs without a validated config."""
    node = _schema()
    for name in path:
        node = _properties(node)[name]
    return {
        k: copy.deepcopy(sub["default"]) for k, sub in _properties(node).items() if "default" in sub
    }


def default_section(cls: type[_S], *path: str) -> _S:
    """A section with every key at its schema default, for code that runs without an
    experiment config, e.g. default_section(AnalysisSection, "analysis")."""
    node = _schema()
    for name in path:
        node = _properties(node)[name]
    return section_from_dict(cls, _defaults_of(node), ".".join(path))


def validate(config: object, source: str = "config", schema_path: Path = SCHEMA_PATH) -> Experiment:
    """Validate `config`, an experiment as given (read from its files or built by a caller: any
    value, what is wrong with it the error); return the typed experiment, built from a copy
    with defaults filled in. Raise ServelabError on the first error."""
    return Experiment.from_dict(resolve(config, source, schema_path))


def resolve(config: object, source: str = "config", schema_path: Path = SCHEMA_PATH) -> JsonObject:
    """Validate `config` (as `validate` takes it); return a copy with defaults filled in, as a
    plain dict. Raise ServelabError on the first error."""
    import jsonschema

    schema = load_schema(schema_path)
    _check_placeholders(config, source)
    check_sweep_axis(config, source)
    check_workload_as_written(config, source)
    if isinstance(config, dict):  # check_written checks a mapping of config keys only
        endpoint_config.check_written(config, source, _endpoint_defaults(schema))
    data = copy.deepcopy(config) if config is not None else {}
    if isinstance(data, dict):  # anything else: the schema says what is wrong with it
        endpoint_config.derive_model(data)  # runtime.kind endpoint: the model is the server's
        data = _apply_defaults(schema, data, endpoint_config.is_endpoint(data))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        validator.iter_errors(data), key=lambda e: (len(e.path), list(map(str, e.path)))
    )
    if errors:
        err = errors[0]
        raise ServelabError(f"{source}: {key_path(err.absolute_path)}: {_describe(err)}")
    if not isinstance(data, dict):  # the schema's top level is an object
        raise TypeError(f"expected a JSON object, got {data!r}")
    cfg: JsonObject = data
    _check_semantics(cfg, source)
    _resolve(cfg)
    return dict(cfg)


def _endpoint_defaults(schema: JsonObject) -> dict[str, JsonObject]:
    """The schema's defaults, an endpoint's where they differ, of the sections an endpoint
    config is checked against as written (servelab.env.endpoint_config.check_written)."""
    return {
        key: _defaults_of(_properties(schema)[key], endpoint=True)
        for key in ("runtime", "server", "model")
    }


def placeholders(node: object, path: tuple[str | int, ...] = ()) -> list[tuple[str, str]]:
    """(key path, hint) of every "<set: HINT>" value, in document order."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += placeholders(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += placeholders(v, (*path, i))
    elif isinstance(node, str):
        m = PLACEHOLDER.match(node.strip())
        if m:
            out.append((key_path(path), m["hint"]))
    return out


def _check_placeholders(config: object, source: str) -> None:
    """One line naming every value still to be pinned, and what to set it to."""
    found = placeholders(config)
    if not found:
        return
    keys = [k for k, _ in found]
    names = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]
    verb = "is" if len(keys) == 1 else "are"
    todo = ", ".join(f"{k} to {hint}" for k, hint in found[:-1])
    todo = f"{todo} and " if todo else ""
    todo += f"{found[-1][0]} to {found[-1][1]}"
    raise ServelabError(f"{source}: {names} {verb} not pinned: set {todo}")


def _resolve(cfg: JsonObject) -> None:
    """Defaults that depend on other keys."""
    model = as_object(cfg["model"])
    if model.get("served_name") is None:
        model["served_name"] = model["repo"] if model["source"] == "hf" else "servelab-tiny"


def _describe(err: jsonschema.exceptions.ValidationError) -> str:
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        return f"{err.message}; allowed keys: {', '.join(allowed)}" if allowed else err.message
    if err.validator == "enum":
        return f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
    if err.validator == "oneOf" and err.context:
        # the alternative that came closest (e.g. sweep.repeats as a plan: its bad key)
        import jsonschema

        near = [e for e in err.context if e.validator != "type"] or err.context
        best = jsonschema.exceptions.best_match(near)
        where = f"{key_path(best.relative_path)}: " if best.relative_path else ""
        return where + _describe(best)
    return str(err.message)


def _check_model(model: JsonObject, source: str) -> None:
    if model["source"] != "hf":
        for key in ("repo", "revision", "local_dir", "allow_patterns"):
            if model.get(key) is not None:
                raise ServelabError(
                    f"{source}: model.{key}: only for model.source hf; remove it or set "
                    "model.source: hf"
                )
        return
    repo, rev = model.get("repo"), model.get("revision")
    if not repo:
        raise ServelabError(
            f"{source}: model.repo: model.source hf needs a repository, e.g. "
            "Qwen/Qwen2.5-3B-Instruct"
        )
    if not isinstance(repo, str) or not HF_REPO.match(repo):
        raise ServelabError(
            f"{source}: model.repo: {repo!r} is not a Hugging Face repository id (ORG/NAME)"
        )
    if not rev:
        raise ServelabError(
            f"{source}: model.revision: not set; pin the commit: set model.revision to the "
            f"40-hex commit sha of {repo} (huggingface.co/{repo}/commits/main lists them)"
        )
    if not isinstance(rev, str) or not COMMIT.match(rev):
        raise ServelabError(
            f"{source}: model.revision: {rev!r} is not a commit (a branch or tag name moves); "
            f"pin the commit: set model.revision to the full 40-hex commit sha of {repo} "
            f"(listed at huggingface.co/{repo}/commits/main)"
        )


def _check_runtime(cfg: JsonObject, source: str) -> None:
    from servelab.env.container import ContainerSettings

    rt = as_object(cfg["runtime"])
    container_keys = ("image", "image_sha256", "gpu_devices", "shm_size")
    check_config_runtimes(cfg, source)
    plan = as_object(cfg["sweep"])["repeats"]
    if isinstance(plan, dict):
        for key in ("interleave", "side_by_side", "slices"):
            if plan.get(key, 0) is None:
                del plan[key]  # absent, as in a plan written before it existed
        check_side_by_side(plan, rt, source)
        check_slices(cfg, source)
    if rt["kind"] == endpoint.KIND:
        return  # servelab launches nothing: endpoint_config.check_written checked it as written
    for key in ("url", "served_model"):
        if rt.get(key, 0) is None:
            del rt[key]  # absent for a launched server, as before these keys existed
    if rt["kind"] == "venv":
        for key in container_keys:
            if rt.get(key) is not None:
                raise ServelabError(
                    f"{source}: runtime.{key}: only for runtime.kind docker, podman or "
                    "apptainer; remove it or change runtime.kind"
                )
        for key in ("mounts", "extra_args"):
            if rt.get(key):
                raise ServelabError(
                    f"{source}: runtime.{key}: only for runtime.kind docker, podman or "
                    "apptainer; remove it or change runtime.kind"
                )
    else:
        try:
            section = section_from_dict(RuntimeSection, rt, "runtime")
            settings = ContainerSettings.from_config(section)
        except ServelabError as exc:
            raise ServelabError(f"{source}: {exc}") from None
        sha = rt.get("image_sha256")
        if settings.image.sif is not None:
            if not sha:
                raise ServelabError(
                    f"{source}: runtime.image_sha256: set it to the sha256 of "
                    f"{settings.image.sif} (sha256sum {settings.image.sif}) to pin the .sif image"
                )
        elif sha is not None:
            raise ServelabError(
                f"{source}: runtime.image_sha256: only for a .sif image; the digest in "
                "runtime.image pins this one - remove runtime.image_sha256"
            )
        if sha is not None and not (isinstance(sha, str) and re.match(r"^[0-9a-f]{64}$", sha)):
            raise ServelabError(
                f"{source}: runtime.image_sha256: {sha!r} is not 64 lowercase hex digits"
            )
    runtime = section_from_dict(RuntimeSection, rt, "runtime")
    if runtime.device == "gpu":
        devices = runtime.gpu_devices
        if devices is not None and runtime.gpus > len(devices):
            raise ServelabError(
                f"{source}: runtime.gpu_devices lists {len(devices)} GPU(s) but runtime.gpus "
                f"is {runtime.gpus}; list at least runtime.gpus devices"
            )
        server = _server(cfg)
        for c in server.configs:
            tp = {**server.args, **c.args}.get("tensor-parallel-size", 1)
            if isinstance(tp, int) and runtime.gpus and tp > runtime.gpus:
                raise ServelabError(
                    f"{source}: server config {c.name!r}: tensor-parallel-size {tp} needs "
                    f"runtime.gpus >= {tp} (it is {runtime.gpus})"
                )


def _server(cfg: JsonObject) -> ServerSection:
    """The validated config's server section, typed."""
    return section_from_dict(ServerSection, as_object(cfg["server"]), "server")


def _check_semantics(cfg: JsonObject, source: str) -> None:
    _check_model(as_object(cfg["model"]), source)
    _check_runtime(cfg, source)
    server = _server(cfg)
    names = server.names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ServelabError(
            f"{source}: server.configs: name {dupes[0]!r} is used twice; names must differ"
        )
    reserved = {"host", "port", "model", "served-model-name"}
    for where, args in [("server.args", server.args)] + [
        (f"server.configs[{i}].args", c.args) for i, c in enumerate(server.configs)
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
    check_rates(as_object(cfg["sweep"]), source)
    _check_search(cfg, source)
    # absent unless given, as before these keys existed
    if cfg.get("confirm", 0) is None:
        del cfg["confirm"]
    if cfg.get("client", 0) is None:
        del cfg["client"]
    check_client(cfg, source)
    analysis = as_object(cfg["analysis"])
    if analysis.get("confirms", 0) is None:
        del analysis["confirms"]
    repeats = as_object(cfg["sweep"])["repeats"]
    if isinstance(repeats, dict):
        repeats.setdefault("budget_s", None)  # a default inside oneOf is not filled in
        if number(repeats["max"]) < number(repeats["min"]):
            raise ServelabError(
                f"{source}: sweep.repeats: max ({repeats['max']}) is below min "
                f"({repeats['min']}); give max >= min"
            )
    from servelab.claims_syntax import parse_claim

    for where in ("analysis", "reproduction"):
        for i, claim in enumerate(as_list(as_object(cfg[where])["claims"])):
            try:
                parse_claim(str(claim))
            except ServelabError as exc:
                raise ServelabError(f"{source}: {where}.claims[{i}]: {exc}") from None
    ref = cfg.get("reference")
    if ref is not None and not Path(str(ref)).exists():
        raise ServelabError(
            f"{source}: reference: {ref!r} not found (relative to {Path.cwd()}); give a release "
            "folder evidence/<experiment>/<tag>, its .tar.gz or a bundle folder"
        )
    check_workload(cfg, source)


def _check_search(cfg: JsonObject, source: str) -> None:
    """search: bounds to search with, configurations that exist, burstiness for gamma only."""
    search = as_object(cfg["search"])
    if not search["enabled"]:
        return
    if all(v is None for v in as_object(as_object(cfg["analysis"])["slo"]).values()):
        raise ServelabError(
            f"{source}: search.enabled: the search needs a bound: set at least one of "
            "analysis.slo.p99_ttft_ms, p99_tpot_ms, p99_e2el_ms (each a per-request bound there)"
        )
    names = _server(cfg).names
    for i, name in enumerate(as_list(search["server_configs"] or [])):
        if name not in names:
            raise ServelabError(
                f"{source}: search.server_configs[{i}]: {name!r} is not in server.configs "
                f"({', '.join(names)})"
            )
    check_arrival(as_object(search["arrival"]), "search.arrival", source)


def load(path: Path, overrides: Mapping[str, JsonValue] | None = None) -> Experiment:
    return validate(read_sources([path], overrides), str(path))


def read_sources(
    files: Sequence[str | Path], settings: Mapping[str, JsonValue] | None = None
) -> JsonValue:
    """An experiment as it is given: each file read as `read_file` reads it (its `extends:`
    overlays resolved), each merged over the one before (Snakemake's --configfile, in order),
    then `settings` (--config's values) over them; the one place where a config's sources
    become one dict, for the workflow and the commands alike."""
    docs = [read_file(Path(f)) for f in files]
    if len(docs) == 1 and not settings and not isinstance(docs[0], dict):
        return docs[0]  # as written: validate() says what is wrong with it
    raw: JsonObject = {}
    for f, doc in zip(files, docs, strict=True):
        if doc is None:
            continue  # an empty file: no keys
        if not isinstance(doc, dict):
            raise ServelabError(
                f"{f}: not a mapping of config keys; write the keys of docs/config.md"
            )
        raw = merge(raw, doc)
    return merge(raw, dict(settings)) if settings else raw


def read_file(path: Path) -> JsonValue:
    """An experiment file as servelab reads it: where it names another in `extends:` (a path
    relative to its own folder), that file's keys with this one's laid over them by overlay()
    (docs/config.md, "Overlays"); any other file as written."""
    return _read_overlay(Path(path), ())


def _read_overlay(path: Path, chain: tuple[Path, ...]) -> JsonValue:
    raw = load_yaml(path)
    if not isinstance(raw, dict) or EXTENDS not in raw:
        return raw
    name = raw.pop(EXTENDS)
    hint = "the experiment file this one overlays, relative to its folder, e.g. ../config.yaml"
    if not isinstance(name, str) or not name.strip():
        raise ServelabError(f"{path}: {EXTENDS}: {name!r} is not a file name; give {hint}")
    base = path.parent / name
    if base.resolve() in (*chain, path.resolve()):
        raise ServelabError(f"{path}: {EXTENDS}: {name} leads back to {path}; break the loop")
    if not base.is_file():
        raise ServelabError(f"{path}: {EXTENDS}: {base}: file not found; give {hint}")
    if "experiment" not in raw:
        raise ServelabError(
            f"{path}: experiment: an overlay names its own experiment (else it writes to the "
            f"results folder of {name}); add experiment: NAME"
        )
    under = _read_overlay(base, (*chain, path.resolve()))
    if not isinstance(under, dict):
        raise ServelabError(f"{base}: not a mapping of config keys (extended by {path})")
    return overlay(under, raw)


def overlay(base: JsonObject, over: JsonObject) -> JsonObject:
    """`over` laid over `base`: mappings key by key, a list or a value replaced whole, and a
    key set to null removed (it takes the schema's default, null wherever null is allowed)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            under = out.get(k)
            out[k] = overlay(under if isinstance(under, dict) else {}, v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def merge(base: JsonObject, over: Mapping[str, JsonValue]) -> JsonObject:
    out = copy.deepcopy(base)
    for k, v in over.items():
        under = out.get(k)
        out[k] = merge(under, v) if isinstance(v, dict) and isinstance(under, dict) else v
    return out


def args_to_cli(args: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for key, value in sorted(args.items()):
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out.append(f"--no-{key}")
        else:
            out += [f"--{key}", str(value)]
    return out
