"""The records of servelab's raw layout (docs/raw-data.md), each owning its versioned JSON.

One type per file: `PointRecord` (point.json; `WarmupRecord` for a warm-up's), `RunRecord`
(run.json), `LaunchRecord` (launch.json), `CapacityRecord` (capacity.json), `CaptureRecord`
(capture.json), `WindowsRecord` (windows.json) and `RuntimeRecord` (runtime.json). Each names
its file (from servelab.store.paths), its schema (src/servelab/schemas/<name>.schema.json) and its
format version (`FORMAT_VERSION`; None for a file that carries none), and has one writer
(`new` builds the document under its format version, `write` writes it, `to_json` is the
document) and one checked reader (`read(path)`, `from_json(doc, path)`). Every reader and writer
of these files goes through them, as pyperf's Run and Benchmark own their JSON.

A record holds the document as written (`doc`: the writer's bytes are exactly those of the
document, sorted keys and floats rounded by servelab.store.jsonio) and gives the fields its readers
use as typed properties.

Checked on read (docs/raw-data.md, "Damaged raw data"): every field present of its schema's
type, the fields the reader needs present (`NEEDS`; the schemas' own `required` lists are for
what the writers write and the bundle holds), and a measured point's `telemetry` block, which
point.schema.json leaves open, against telemetry.schema.json. Damage raises DamagedRawData: one
line naming the file, the field and what to do. The validators are compiled once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from servelab.design.arrivals import ArrivalProcess, schedule_sha256, scheduled_rate
from servelab.documents import JsonObject, JsonValue
from servelab.documents.declared import ArrivalSummary
from servelab.errors import ServelabError
from servelab.store.jsonio import DamagedFile, clean, json_path, load_schema, read_json, write_json
from servelab.store.paths import (
    ARRIVALS_DIR,
    CAPACITY_FILE,
    CAPTURE_FILE,
    CLIENT_FILE,
    CLIENTS_FILE,
    LAUNCH_FILE,
    POINT_FILE,
    RUN_FILE,
    RUNTIME_FILE,
    WINDOWS_FILE,
    ExperimentPaths,
)

__all__ = [
    "ArrivalsRecord",
    "CapacityRecord",
    "CaptureRecord",
    "Check",
    "ClientRunRecord",
    "ClientsRecord",
    "DamagedRawData",
    "LaunchRecord",
    "PointRecord",
    "Record",
    "RunRecord",
    "RuntimeRecord",
    "WarmupRecord",
    "WindowsRecord",
    "config_of",
    "launch_files",
    "relative",
]


class DamagedRawData(DamagedFile):
    """A raw file that cannot be read: the one line names the file, the field and what to do
    (re-run the sweep of its server configuration, or skip it; `todo`, when given, says what
    to do instead)."""

    def __init__(self, path: Path, field: str, what: str, todo: str | None = None) -> None:
        super().__init__(path, field, what)
        self.server_config = config_of(path)
        self.todo = todo
        self.args = (self.line(),)

    def line(self, root: Path | None = None) -> str:
        """The one line, the file named as given, or relative to `root` (the experiment folder)
        when it lies under it: a report's lines then read the same on every host."""
        path = str(self.path) if root is None else relative(self.path, root)
        if self.todo is not None:
            return f"{path}: {self.field}: {self.what}; {self.todo}"
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
    """The server configuration a raw file belongs to: the folder after raw/, server/ or
    profile/."""
    parts = path.parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in ("raw", "server", "profile") and i + 1 < len(parts) - 1:
            return parts[i + 1]
    return None


# The blocks a reader checks beyond its file's schema, each against a schema file of its own:
# a measured point's `telemetry` (a warm-up's is not read).
_BLOCKS: dict[str, dict[str, str]] = {"measured": {"telemetry": "telemetry"}}


def _without_required(node: JsonValue) -> JsonValue:
    if isinstance(node, dict):
        return {k: _without_required(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_without_required(v) for v in node]
    return node


def _block_schema(name: str) -> JsonObject:
    """The schema file `name` as a property's subschema (without its own $id and $schema)."""
    return {k: v for k, v in load_schema(name).items() if k not in ("$id", "$schema")}


@dataclass(frozen=True)
class Check:
    """What a reader checks: the schema (src/servelab/schemas/<schema>.schema.json), the
    top-level fields it needs present, the blocks it checks beyond the schema (_BLOCKS[blocks]),
    the top-level fields it leaves to a reader of its own (`open`), and what to do about damage
    when it is not to re-run the sweep (DamagedRawData)."""

    schema: str
    needs: tuple[str, ...] = ()
    blocks: str | None = None
    open: tuple[str, ...] = ()
    todo: str | None = None


@functools.cache
def _validator(check: Check) -> Callable[[JsonObject], list[tuple[str, str]]]:
    """The compiled validator of a reader's Check, built once: a function from a document to
    its errors as (JSON path, message), first by path."""
    import jsonschema

    schema = _without_required(load_schema(check.schema))
    assert isinstance(schema, dict)
    listed = schema.get("properties", {})
    assert isinstance(listed, dict)
    properties: JsonObject = {**listed, **{k: {} for k in check.open}}
    if check.blocks is not None:
        properties.update({k: _block_schema(v) for k, v in _BLOCKS[check.blocks].items()})
    schema["properties"] = properties
    if check.needs:
        schema["required"] = list(check.needs)
    v = jsonschema.Draft202012Validator(schema)

    def errors(doc: JsonObject) -> list[tuple[str, str]]:
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


def read_raw(path: Path, todo: str | None = None) -> JsonValue:
    """A raw JSON file's document, unchecked (DamagedRawData when it is not JSON)."""
    try:
        doc: JsonValue = read_json(path)
    except DamagedFile as exc:
        raise DamagedRawData(path, exc.field, exc.what, todo) from None
    return doc


def checked(path: Path, doc: JsonValue, check: Check) -> JsonObject:
    """`doc` (read from `path`) checked as `check` says: an object, every field present of its
    schema's type, the fields it needs present, its blocks as their schemas say
    (DamagedRawData otherwise)."""
    if not isinstance(doc, dict):
        what = f"a {type(doc).__name__}, not a JSON object"
        raise DamagedRawData(path, "$", what, check.todo)
    errors = _validator(check)(doc)
    if errors:
        where, what = errors[0]
        top = re.split(r"[.\[]", where[2:], maxsplit=1)[0] if where.startswith("$.") else ""
        if check.blocks is not None and top in _BLOCKS[check.blocks]:
            source = f"the {top} block, docs/raw-data.md"
        else:
            source = f"schema {check.schema}.schema.json"
        raise DamagedRawData(path, where, f"{what} ({source})", check.todo)
    return doc


@dataclass(frozen=True)
class Record:
    """One JSON file of the raw layout: its document (`doc`), as written or as read and
    checked. A subclass names the file, its schema, its format version and what its reader
    needs."""

    doc: dict[str, Any]

    FILE: ClassVar[str] = ""
    SCHEMA: ClassVar[str] = ""
    # the format_version the writer writes; None: the file carries none
    FORMAT_VERSION: ClassVar[int | None] = None
    # the top-level fields the reader needs present
    NEEDS: ClassVar[tuple[str, ...]] = ()
    # the blocks checked beyond the schema (_BLOCKS)
    BLOCKS: ClassVar[str | None] = None
    # the top-level fields a reader of their own checks (left open here)
    OPEN: ClassVar[tuple[str, ...]] = ()
    # what to do about a damaged file, when it is not to re-run the sweep (DamagedRawData)
    TODO: ClassVar[str | None] = None

    @classmethod
    def new(cls, fields: Mapping[str, object]) -> Self:
        """The record of `fields`, under this format version, to write."""
        head = {} if cls.FORMAT_VERSION is None else {"format_version": cls.FORMAT_VERSION}
        return cls({**head, **fields})

    def to_json(self) -> dict[str, Any]:
        """The document, as the file holds it."""
        return self.doc

    def write(self, path: Path) -> None:
        """Write the file (atomically; same document, same bytes)."""
        write_json(path, self.doc)

    @classmethod
    def from_json(cls, doc: JsonValue, path: Path) -> Self:
        """The record of `doc`, read from `path`, checked (DamagedRawData otherwise)."""
        return cls(checked(path, doc, cls.check()))

    @classmethod
    def check(cls) -> Check:
        """What the reader checks."""
        return Check(cls.SCHEMA, cls.NEEDS, cls.BLOCKS, cls.OPEN, cls.TODO)

    @classmethod
    def read(cls, path: Path) -> Self:
        """The record in `path`, checked (an error when it is missing, DamagedRawData when
        it is damaged)."""
        return cls.from_json(read_raw(path, cls.TODO), path)

    @classmethod
    def read_if_present(cls, path: Path) -> Self | None:
        """The record in `path`, checked; None when there is no such file."""
        return cls.read(path) if path.is_file() else None

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the document, `default` when absent."""
        return self.doc.get(key, default)

    def _int(self, key: str) -> int | None:
        value = self.doc.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _float(self, key: str) -> float | None:
        value = self.doc.get(key)
        return float(value) if isinstance(value, int | float) else None

    def _dict(self, key: str) -> JsonObject | None:
        value = self.doc.get(key)
        return value if isinstance(value, dict) else None


SUPPORTED_POINT_FORMATS = {1}
# what a measured point's reader needs (a warm-up's: its format version only)
# (and its level: concurrency, or rate for an open-loop point; PointRecord.from_json)
POINT_NEEDS = ("format_version", "status", "server_config", "repeat")
WARMUP_NEEDS = ("format_version",)


@dataclass(frozen=True)
class PointRecord(Record):
    """point.json: one measured point (raw/<sc>/rep<RR>/c<CCCC>/), its metrics and telemetry."""

    FILE = POINT_FILE
    SCHEMA = "point"
    FORMAT_VERSION = 1
    NEEDS: ClassVar[tuple[str, ...]] = POINT_NEEDS
    BLOCKS: ClassVar[str | None] = "measured"

    @classmethod
    def from_json(cls, doc: JsonValue, path: Path) -> Self:
        """A format version this servelab does not read is an error of its own; then the
        checks. A damaged telemetry block is damage of the point (skipped whole by
        --skip-damaged): the validity checks that leave a point out of the statistics read it."""
        version = doc.get("format_version") if isinstance(doc, dict) else None
        if isinstance(doc, dict) and version not in SUPPORTED_POINT_FORMATS:
            raise ServelabError(
                f"{path}: point format_version {version!r} is not one this servelab reads "
                f"({sorted(SUPPORTED_POINT_FORMATS)}); upgrade servelab or re-run the sweep"
            )
        record = super().from_json(doc, path)
        if (
            cls.NEEDS is POINT_NEEDS
            and "concurrency" not in record.doc
            and "rate" not in record.doc
        ):
            raise DamagedRawData(
                path, "$.concurrency", "required field missing (a point has concurrency or rate)"
            )
        return record

    @staticmethod
    def status_in(folder: Path) -> str | None:
        """The status the point.json in `folder` says, for resuming a sweep: None when there
        is none or it is not a JSON object (a point to measure again)."""
        path = folder / POINT_FILE
        if not path.exists():
            return None
        try:
            doc = read_json(path)
        except DamagedFile:
            return None
        status = doc.get("status") if isinstance(doc, dict) else None
        return status if isinstance(status, str) else None

    @property
    def status(self) -> str | None:
        value = self.doc.get("status")
        return value if isinstance(value, str) else None

    @property
    def server_config(self) -> str:
        return str(self.doc["server_config"])

    @property
    def repeat(self) -> int | None:
        return self._int("repeat")

    @property
    def concurrency(self) -> int | None:
        return self._int("concurrency")

    @property
    def rate(self) -> float | None:
        """An open-loop point's request rate; None for a closed-loop point."""
        return self._float("rate")

    @property
    def started_epoch_ns(self) -> int | None:
        return self._int("started_epoch_ns")

    @property
    def finished_epoch_ns(self) -> int | None:
        return self._int("finished_epoch_ns")


@dataclass(frozen=True)
class WarmupRecord(PointRecord):
    """A warm-up's point.json (raw/<sc>/warmup/): read for its format version and what the
    validity checks compare; its telemetry block is not read."""

    NEEDS = WARMUP_NEEDS
    BLOCKS = None


@dataclass(frozen=True)
class RunRecord(Record):
    """run.json: a finished sweep of one server configuration (the sweep job's output)."""

    FILE = RUN_FILE
    SCHEMA = "run"
    FORMAT_VERSION = 1

    @property
    def sequential(self) -> JsonObject | None:
        """A sequential sweep's record (its rule, rounds and why it stopped); None for a fixed
        number of repeats."""
        return self._dict("sequential")

    @property
    def canary(self) -> JsonObject | None:
        """The host-speed canary before the job's first launch and after its last, and their
        drift (servelab.hostfacts.canary.RunCanary.from_json reads it); None in runs written
        before it was recorded."""
        return self._dict("canary")


@dataclass(frozen=True)
class LaunchRecord(Record):
    """launch.json: the latest server launch of a configuration (server/<sc>/)."""

    FILE = LAUNCH_FILE
    SCHEMA = "launch"

    @property
    def launch(self) -> int:
        """Which launch of the configuration this is (1 for the first)."""
        return int(self.doc.get("launch", 0))

    @property
    def args(self) -> JsonObject | None:
        return self._dict("args")

    @property
    def node(self) -> JsonObject | None:
        return self._dict("node")

    @property
    def cpu_facts(self) -> JsonObject | None:
        return self._dict("cpu_facts")

    @property
    def started_epoch_ns(self) -> int | None:
        return self._int("started_epoch_ns")

    @property
    def ready_s(self) -> float | None:
        return self._float("ready_s")

    @property
    def lock_waited_s(self) -> float:
        """Seconds this launch waited for the host's measuring-server lock (`lock.waited_s`;
        0 when it did not wait, or for raw data from before `lock`)."""
        value = (self._dict("lock") or {}).get("waited_s")
        return float(value) if isinstance(value, int | float) else 0.0


@dataclass(frozen=True)
class CapacityRecord(Record):
    """capacity.json: the facts of a configuration's server startup log (server/<sc>/)."""

    FILE = CAPACITY_FILE
    SCHEMA = "capacity"

    @property
    def vllm_version(self) -> str | None:
        """The version the server's /version endpoint said, else its log."""
        value = self.doc.get("version_endpoint") or self.doc.get("version")
        return str(value) if value else None


@dataclass(frozen=True)
class CaptureRecord(Record):
    """capture.json: one profiling job (profile/<sc>/): profiled, or not and why."""

    FILE = CAPTURE_FILE
    SCHEMA = "capture"
    FORMAT_VERSION = 1
    TODO = "re-run the profiling pass of its server configuration"

    @property
    def status(self) -> str | None:
        value = self.doc.get("status")
        return value if isinstance(value, str) else None

    @property
    def ready_s(self) -> float | None:
        return self._float("ready_s")


@dataclass(frozen=True)
class WindowsRecord(Record):
    """windows.json: the diagnostic points of a profiling pass. Its format version and its
    windows are checked by servelab.profile.windows, which reads them into windows (also from
    a windows.json written by hand for `servelab profile analyze`): its messages name the
    window; the other fields are checked here."""

    FILE = WINDOWS_FILE
    SCHEMA = "windows"
    FORMAT_VERSION = 1
    OPEN = ("format_version", "windows")
    TODO = "re-run the profiling pass of its server configuration"


@dataclass(frozen=True)
class ArrivalsRecord(Record):
    """raw/<sc>/arrivals/r<rate>.json: the send schedule of one rate's open-loop points (every
    repeat sends on it), with the process it was drawn from."""

    FILE = ARRIVALS_DIR
    SCHEMA = "arrivals"
    FORMAT_VERSION = 1
    NEEDS = ("format_version", "rate", "offsets_ns", "schedule_sha256")

    @classmethod
    def of(cls, process: ArrivalProcess, requests: int, max_in_flight: int | None) -> Self:
        """The schedule of `requests` sends drawn from `process`."""
        offsets = [int(t) for t in process.schedule_ns(requests)]
        # as the file holds it (floats rounded by servelab.store.jsonio): the record drawn again
        # equals the record read back
        return cls.new(
            clean(
                {
                    "process": process.kind,
                    "rate": process.rate,
                    "burstiness": process.burstiness,
                    "seed": process.seed,
                    "max_in_flight": max_in_flight,
                    "requests": requests,
                    "scheduled_rate": scheduled_rate(offsets),
                    "schedule_sha256": schedule_sha256(offsets),
                    "offsets_ns": offsets,
                }
            )
        )

    @classmethod
    def from_json(cls, doc: JsonValue, path: Path) -> Self:
        """Checked, and its send times checked against its sha256."""
        record = super().from_json(doc, path)
        if schedule_sha256(record.offsets_ns) != record.doc["schedule_sha256"]:
            raise DamagedRawData(
                path, "$.offsets_ns", "the send times do not match schedule_sha256"
            )
        return record

    @property
    def offsets_ns(self) -> list[int]:
        return [int(t) for t in self.doc["offsets_ns"]]

    def summary(self) -> ArrivalSummary:
        """What a point records of its schedule (point.json `arrival`)."""
        return {
            "process": self.doc["process"],
            "burstiness": self.doc["burstiness"],
            "seed": self.doc["seed"],
            "max_in_flight": self.doc["max_in_flight"],
            "requests": self.doc["requests"],
            "scheduled_rate": self.doc["scheduled_rate"],
            "schedule_sha256": self.doc["schedule_sha256"],
        }


@dataclass(frozen=True)
class ClientsRecord(Record):
    """runtime/clients.json: the venvs of the tools of client.cross_check
    (servelab.env.client_tools)."""

    FILE = CLIENTS_FILE
    SCHEMA = "clients"
    FORMAT_VERSION = 1
    NEEDS = ("tools",)
    TODO = "re-run the client_tools stage"


@dataclass(frozen=True)
class ClientRunRecord(Record):
    """raw/<sc>/clients/<tool>/rep_<NN>/concurrency_<CCC>/client.json: one tool's run of one
    point (servelab.measure.crosscheck)."""

    FILE = CLIENT_FILE
    SCHEMA = "client_run"
    FORMAT_VERSION = 1
    NEEDS = ("tool", "status", "cpu_s", "wall_s")


@dataclass(frozen=True)
class RuntimeRecord(Record):
    """runtime.json: the server runtime the runtime stage made (runtime/)."""

    FILE = RUNTIME_FILE
    SCHEMA = "runtime"
    TODO = "re-run the runtime stage"

    @property
    def in_container(self) -> bool:
        """The runtime is a container (`kind`), not a venv."""
        return bool(self.doc.get("kind") == "container")

    @property
    def python(self) -> str:
        """The runtime's Python, which runs the server."""
        return str(self.doc["python"])

    @property
    def vllm_cli(self) -> bool:
        """The runtime's vLLM has the `vllm serve` entry point."""
        return bool(self.doc.get("vllm_cli"))

    @property
    def isa(self) -> JsonObject | None:
        """The CPU instruction set PyTorch and oneDNN use in the runtime."""
        return self._dict("isa")


def launch_files(paths: ExperimentPaths) -> list[tuple[str, Path, type[Record]]]:
    """Every server launch an experiment records, latest of each, with the record type that
    reads it: ("sweep", server/<sc>/launch.json, LaunchRecord) per configuration, then
    ("profile", profile/<sc>/capture.json, CaptureRecord) per profiling pass (its own launch,
    or the sweep's: capture.json `launch`), each in folder order."""
    return [
        *(("sweep", p, LaunchRecord) for p in paths.launch_files()),
        *(("profile", p, CaptureRecord) for p in paths.capture_files()),
    ]
