"""Deterministic JSON and gzip-JSONL writing: same data, same bytes."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import threading
import zlib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, overload

from servelab.documents import JsonObject, JsonValue
from servelab.errors import ServelabError


@overload
def clean(value: Mapping[str, object]) -> JsonObject: ...
@overload
def clean(value: object) -> JsonValue: ...
def clean(value: object) -> JsonValue:
    """Round floats to a fixed precision and map NaN/inf to None so output is stable JSON."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return float(f"{value:.9g}")
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if value is None or isinstance(value, str | int):
        return value
    # what json.dumps says of it
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(data: object, indent: int | None = 2) -> str:
    text = json.dumps(
        clean(data), sort_keys=True, indent=indent, ensure_ascii=False, allow_nan=False
    )
    return text + "\n" if indent is not None else text


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8) to `path` atomically: into a temp file beside it, renamed
    over it, so a killed job never leaves half a file. The temp file is this process's and
    thread's own (`<name>.<pid>-<thread>.tmp`): two writers of one file (jobs building the same
    shared cache entry) never rename each other's half-written file, and the last stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, data: object) -> None:
    """Write atomically (write_atomic) so a killed job never leaves half a file."""
    write_atomic(path, dumps(data))


class DamagedFile(ServelabError):
    """A file that cannot be read as what it should be: `field` is where (a JSON path such
    as `$.concurrency`, or `line 3` of a JSON-lines file), `what` what is wrong. Readers of
    raw data add what to do (rawdata.DamagedRawData)."""

    def __init__(self, path: Path, field: str, what: str) -> None:
        self.path = path
        self.field = field
        self.what = what
        super().__init__(f"{path}: {field}: {what}")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise DamagedFile(path, "$", f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason})") from None


def as_object(node: JsonValue) -> JsonObject:
    """`node` where a checked document (one its schema has validated) holds an object;
    TypeError where it does not."""
    if not isinstance(node, dict):
        raise TypeError(f"expected a JSON object, got {node!r}")
    return node


def as_list(node: JsonValue) -> list[JsonValue]:
    """`node` where a checked document holds an array; TypeError where it does not."""
    if not isinstance(node, list):
        raise TypeError(f"expected a JSON array, got {node!r}")
    return node


def write_jsonl_gz(path: Path, rows: Iterable[Mapping[str, object]]) -> None:
    """gzip with mtime 0 and no file name in the header: the bytes depend only on the rows."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        for row in rows:
            gz.write(dumps(row, indent=None).encode("utf-8") + b"\n")
    write_atomic(path, buf.getvalue())


def json_object_line(path: Path, lineno: int, line: str, todo: str = "") -> JsonObject:
    """Line `lineno` of a JSON-lines file, which must be one JSON object; DamagedFile naming
    the line otherwise (`todo`: what to do, appended to the message)."""
    tail = f"; {todo}" if todo else ""
    try:
        row: JsonValue = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DamagedFile(path, f"line {lineno}", f"not valid JSON ({exc.msg}){tail}") from None
    if not isinstance(row, dict):
        what = f"a {type(row).__name__}, not a JSON object"
        raise DamagedFile(path, f"line {lineno}", f"{what}{tail}")
    return row


def read_jsonl_gz(path: Path) -> list[JsonObject]:
    """Every row of a gzip JSON-lines file; a truncated or corrupt stream, a line that is not
    JSON or not an object: DamagedFile naming the line."""
    rows: list[JsonObject] = []
    lineno = 0
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    rows.append(json_object_line(path, lineno, line))
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DamagedFile(
            path, f"line {lineno + 1}", f"truncated or corrupt gzip stream ({exc})"
        ) from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, f"line {lineno + 1}", f"not UTF-8 text ({exc.reason})") from None
    return rows


def json_path(parts: Iterable[str | int]) -> str:
    """A JSON path for people: ("points", 3, "ttft") -> $.points[3].ttft."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def load_schema(name: str, version: int | None = None) -> JsonObject:
    """The schema `name` (src/servelab/schemas/<name>.schema.json); with `version`, the schema
    of that format version of the document when it is not the current one
    (<name>.v<version>.schema.json, kept so that older bundles still verify)."""
    files = resources.files("servelab").joinpath("schemas")
    schema: JsonObject = json.loads(files.joinpath(f"{name}.schema.json").read_text("utf-8"))
    properties = schema.get("properties")
    format_version = properties.get("format_version") if isinstance(properties, dict) else None
    current = format_version.get("const") if isinstance(format_version, dict) else None
    if version is not None and current is not None and version != current:
        older = files.joinpath(f"{name}.v{version}.schema.json")
        if older.is_file():
            schema = json.loads(older.read_text("utf-8"))
    return schema
