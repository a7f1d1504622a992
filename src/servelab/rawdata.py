"""Reading servelab's raw layout (docs/raw-data.md).

`load_points` is the one reader of the measured points: every complete point.json of an
experiment folder, each with its folder and what the validity checks read beside it (its
configuration's launch arguments and warm-up). The analysis, the end-of-run summary and
`servelab telemetry summarize` all read points through it.

Every file read here is checked on read (docs/raw-data.md, "Damaged raw data"): point.json
and the warm-up's against point.schema.json (a measured point's `telemetry` block, which the
schema leaves open, against TELEMETRY_BLOCK below), launch.json against launch.schema.json,
capacity.json against capacity.schema.json (compiled validators, built once), and each row of
requests.jsonl.gz against the fields RequestRecord expects (cheap type checks). Damage raises
DamagedRawData: one line naming the file, the field and what to do. run.json and
telemetry.jsonl are not read here (nothing the analysis makes depends on them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.client.record import RecordFieldError, RequestRecord
from servelab.errors import ServelabError
from servelab.jsonio import DamagedFile, json_path, load_schema, read_json, read_jsonl_gz
from servelab.paths import POINT_FILE, ExperimentPaths

SUPPORTED_POINT_FORMATS = {1}
REQUESTS_FILE = "requests.jsonl.gz"


@dataclass(frozen=True)
class RawPoint:
    """One complete measured point: its point.json (`meta`), its folder, and the context the
    validity checks read: the configuration's launch arguments (server/<sc>/launch.json
    `args`) and its warm-up's point.json (raw/<sc>/warmup/), each None when absent."""

    meta: dict[str, Any]
    folder: Path
    server_args: Mapping[str, Any] | None = None
    warmup: Mapping[str, Any] | None = None

    @property
    def server_config(self) -> str:
        return str(self.meta["server_config"])

    @property
    def requests_path(self) -> Path:
        return self.folder / REQUESTS_FILE

    def request_rows(self) -> list[dict[str, Any]]:
        """The rows of requests.jsonl.gz (an error when the file is missing; DamagedRawData
        when it is truncated or a line is not a JSON object)."""
        path = self.requests_path
        try:
            return read_jsonl_gz(path)
        except DamagedFile as exc:
            raise DamagedRawData(path, exc.field, exc.what) from None

    def records(self) -> list[RequestRecord]:
        """The requests of the point, each row checked against the fields of RequestRecord
        (DamagedRawData naming the line and field otherwise)."""
        out = []
        for i, row in enumerate(self.request_rows(), 1):
            try:
                out.append(RequestRecord.from_json(row))
            except RecordFieldError as exc:
                raise DamagedRawData(
                    self.requests_path, f"line {i}: $.{exc.field}", exc.what
                ) from None
        return out


class DamagedRawData(DamagedFile):
    """A raw file that cannot be read: the one line names the file, the field and what to do
    (re-run the sweep of its server configuration, or skip it)."""

    def __init__(self, path: Path, field: str, what: str) -> None:
        super().__init__(path, field, what)
        self.server_config = config_of(path)
        self.args = (self.line(),)

    def line(self, root: Path | None = None) -> str:
        """The one line, the file named as given, or relative to `root` (the experiment folder)
        when it lies under it: a report's lines then read the same on every host."""
        path = str(self.path) if root is None else relative(self.path, root)
        todo = f"re-run the sweep of {self.server_config or 'its server configuration'}"
        return (
            f"{path}: {self.field}: {self.what}; {todo}, or pass --skip-damaged to servelab analyze"
        )


def relative(path: Path, root: Path) -> str:
    """`path` relative to `root` when it lies under it, else as given (POSIX separators)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def config_of(path: Path) -> str | None:
    """The server configuration a raw file belongs to: the folder after raw/ or server/."""
    parts = path.parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in ("raw", "server") and i + 1 < len(parts) - 1:
            return parts[i + 1]
    return None


# What each reader needs present (docs/raw-data.md, "Damaged raw data"): the schemas' own
# `required` lists are for what the sweep writes and the bundle holds; a reader requires only
# the fields it reads, and checks the type of every field present.
POINT_NEEDS = ("format_version", "status", "server_config", "repeat", "concurrency")
WARMUP_NEEDS = ("format_version",)

# point.json's `telemetry` block (servelab.telemetry.summarize; docs/raw-data.md) as its readers
# use it: the analysis columns, the validity checks and the diagnoses take numbers out of it,
# so every block is an object and every statistic a number or null. point.schema.json leaves
# the block open (the bundle checks it as written); these are the reader's checks.
_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STATS = {"type": ["object", "null"], "properties": {k: _NUM for k in ("mean", "p95", "max")}}
_HISTOGRAM = {
    "type": ["object", "null"],
    "properties": {k: _NUM for k in ("count", "mean_ms", "p95_ms")},
}
_GPU_FIELDS = ("util_pct", "mem_util_pct", "sm_clock_mhz", "mem_used_bytes", "power_w", "temp_c")
TELEMETRY_BLOCK: dict[str, Any] = {
    "type": ["object", "null"],
    "properties": {
        "enabled": {"type": "boolean"},
        "gpu": {
            "type": ["object", "null"],
            "properties": {
                "devices": {
                    "type": ["array", "null"],
                    "items": {
                        "type": "object",
                        "properties": {
                            "device": _INT,
                            "samples": _INT,
                            "errors": _INT,
                            "energy_j": _NUM,
                            **{k: _STATS for k in _GPU_FIELDS},
                        },
                    },
                },
            },
        },
        "cpu": {
            "type": ["object", "null"],
            "properties": {
                "samples": _INT,
                "host_cpus": _INT,
                **{
                    k: _STATS
                    for k in ("server_cpu_pct", "client_cpu_pct", "telemetry_cpu_pct")
                    + ("host_cpu_pct", "server_rss_bytes", "client_rss_bytes")
                    + ("host_mem_used_bytes",)
                },
                **{k: _NUM for k in ("server_cpu_s", "client_cpu_s", "telemetry_cpu_s")},
            },
        },
        "server": {
            "type": ["object", "null"],
            "properties": {
                "samples": _INT,
                "errors": _INT,
                **{k: _STATS for k in ("running", "waiting", "kv_cache_usage")},
                **{k: _HISTOGRAM for k in ("ttft", "itl", "queue_time")},
                **{
                    k: _NUM
                    for k in ("waiting_fraction", "preemptions", "generation_tokens")
                    + ("generation_tokens_per_s", "prompt_tokens", "prefix_cache_queries")
                    + ("prefix_cache_hits", "requests_finished")
                },
            },
        },
        "rapl": {
            "type": ["object", "null"],
            "properties": {"samples": _INT, "errors": _INT, "energy_j": _NUM},
        },
        "energy": {
            "type": ["object", "null"],
            "properties": {
                "source": {"enum": ["nvml", "rapl", None]},
                "output_tokens": _INT,
                **{k: _NUM for k in ("joules", "window_s", "joules_per_output_token")},
            },
        },
    },
}
# what a reader checks beyond its file's schema: the measured point's telemetry block (a
# warm-up's is not read)
_READER_PROPERTIES: dict[str, dict[str, Any]] = {"measured": {"telemetry": TELEMETRY_BLOCK}}


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_without_required(v) for v in node]
    return node


@functools.cache
def _validator(
    name: str, needs: tuple[str, ...], extra: str | None = None
) -> Callable[[Any], list[tuple[str, str]]]:
    """The compiled validator of src/servelab/schemas/<name>.schema.json for a reader that
    needs the top-level fields `needs` (and checks the properties _READER_PROPERTIES[extra]
    too), built once: a function from a document to its errors as (JSON path, message),
    first by path."""
    import jsonschema

    schema = _without_required(load_schema(name))
    if extra is not None:
        schema["properties"] = {**schema.get("properties", {}), **_READER_PROPERTIES[extra]}
    if needs:
        schema["required"] = list(needs)
    v = jsonschema.Draft202012Validator(schema)

    def errors(doc: Any) -> list[tuple[str, str]]:
        out = []
        for err in v.iter_errors(doc):
            where = json_path(err.absolute_path)
            what = err.message
            if err.validator == "required" and isinstance(err.instance, dict):
                missing = [k for k in err.validator_value if k not in err.instance]
                if missing:
                    where = f"{where}.{missing[0]}"
                    what = "required field missing"
            out.append((where, what))
        return sorted(out)

    return errors


def read_checked(path: Path, schema: str, needs: tuple[str, ...] = ()) -> dict[str, Any]:
    """A raw JSON file checked against its schema: every field present of its schema's type,
    the fields in `needs` present (DamagedRawData otherwise)."""
    return _checked(path, _read(path), schema, needs)


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except DamagedFile as exc:
        raise DamagedRawData(path, exc.field, exc.what) from None


def _checked(
    path: Path, doc: Any, schema: str, needs: tuple[str, ...], extra: str | None = None
) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise DamagedRawData(path, "$", f"a {type(doc).__name__}, not a JSON object")
    errors = _validator(schema, needs, extra)(doc)
    if errors:
        where, what = errors[0]
        top = re.split(r"[.\[]", where[2:], maxsplit=1)[0] if where.startswith("$.") else ""
        if extra is not None and top in _READER_PROPERTIES[extra]:
            source = f"the {top} block, docs/raw-data.md"
        else:
            source = f"schema {schema}.schema.json"
        raise DamagedRawData(path, where, f"{what} ({source})")
    return doc


def point_files(exp_dir: Path) -> list[Path]:
    """Complete measured points only: `.partial` and `.incomplete` folders never match."""
    pattern = f"*/rep[0-9][0-9]/c[0-9][0-9][0-9][0-9]/{POINT_FILE}"
    return sorted(ExperimentPaths(exp_dir).raw.glob(pattern))


def load_point(path: Path, measured: bool = True) -> dict[str, Any]:
    """point.json checked against point.schema.json, with the fields a measured point's
    reader needs (POINT_NEEDS; WARMUP_NEEDS for the warm-up); DamagedRawData otherwise."""
    point = _read(path)
    version = point.get("format_version") if isinstance(point, dict) else None
    if isinstance(point, dict) and version not in SUPPORTED_POINT_FORMATS:
        raise ServelabError(
            f"{path}: point format_version {version!r} is not one this servelab reads "
            f"({sorted(SUPPORTED_POINT_FORMATS)}); upgrade servelab or re-run the sweep"
        )
    if measured:
        # a damaged telemetry block is damage of the point, skipped whole by --skip-damaged:
        # the validity checks that leave a point out of the statistics (contention, restarted
        # requests) read it, so keeping the point without it would let a point those checks
        # exclude into every table, unchecked
        return _checked(path, point, "point", POINT_NEEDS, "measured")
    return _checked(path, point, "point", WARMUP_NEEDS)


@dataclass(frozen=True)
class Skipped:
    """What --skip-damaged left out, with the damage that made it: a point (`path` its
    folder), or a file of a server configuration (`path` the file; `left_out` what the
    analysis goes without)."""

    path: Path
    damage: DamagedRawData
    left_out: str | None = None

    @property
    def reason(self) -> str:
        return str(self.damage)


def load_points(exp_dir: Path, skipped: list[Skipped] | None = None) -> list[RawPoint]:
    """Every complete measured point of `exp_dir`, in folder order, with its context.
    Damaged raw data raises DamagedRawData; with `skipped` (a list), a point whose point.json,
    or whose configuration's launch.json or warm-up, is damaged is left out and listed there
    instead."""
    context = _contexts(exp_dir, skipped is not None)
    out = []
    for path in point_files(exp_dir):
        try:
            meta = load_point(path)
        except DamagedRawData as exc:
            if skipped is None:
                raise
            skipped.append(Skipped(path.parent, exc))
            continue
        if meta.get("status") != "complete":
            continue
        ctx = context.get(str(meta["server_config"]), (None, None))
        if isinstance(ctx, DamagedRawData):
            assert skipped is not None
            skipped.append(Skipped(path.parent, ctx))
            continue
        args, warmup = ctx
        out.append(RawPoint(meta, path.parent, args, warmup))
    return out


_Context = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


def _contexts(exp_dir: Path, keep_damage: bool = False) -> dict[str, _Context | DamagedRawData]:
    """Per raw/<sc>/ folder, read once: its launch arguments and its warm-up's point.json
    (with `keep_damage`, the damage of either instead of raising it)."""
    out: dict[str, _Context | DamagedRawData] = {}
    paths = ExperimentPaths(exp_dir)
    for d in sorted(paths.raw.iterdir()) if paths.raw.is_dir() else []:
        if not d.is_dir():
            continue
        lj = paths.server(d.name) / "launch.json"
        wp = paths.warmup(d.name) / POINT_FILE
        try:
            args = read_checked(lj, "launch").get("args") if lj.is_file() else None
            warmup = load_point(wp, measured=False) if wp.is_file() else None
        except DamagedRawData as exc:
            if not keep_damage:
                raise
            out[d.name] = exc
            continue
        out[d.name] = (
            args if isinstance(args, dict) else None,
            warmup if isinstance(warmup, dict) else None,
        )
    return out
