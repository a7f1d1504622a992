"""Reading servelab's raw layout (docs/raw-data.md).

`load_points` is the one reader of the measured points: every complete point.json of an
experiment folder, each with its folder and what the validity checks read beside it (its
configuration's launch arguments and warm-up). The analysis, the end-of-run summary and
`servelab telemetry summarize` all read points through it.

Every file is read through its record type (servelab.store.records), which checks it on read
(docs/raw-data.md, "Damaged raw data"): point.json and the warm-up's (PointRecord,
WarmupRecord), launch.json (LaunchRecord); each row of requests.jsonl.gz is checked against the
fields RequestRecord expects (cheap type checks). Damage raises DamagedRawData: one line naming
the file, the field and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.design.level import Level
from servelab.documents import JsonObject, JsonValue
from servelab.store.jsonio import DamagedFile, read_jsonl_gz
from servelab.store.paths import POINT_FILE, REQUESTS_FILE, ExperimentPaths, attempt_dirs
from servelab.store.records import (
    DamagedRawData,
    LaunchRecord,
    PointRecord,
    WarmupRecord,
    relative,
)
from servelab.store.request import RecordFieldError, RequestRecord

__all__ = [
    "DamagedRawData",
    "RawPoint",
    "Skipped",
    "load_points",
    "relative",
]


# the server settings the analysis reads from a configuration's arguments, as a vLLM server
# says them on /metrics: (argument, info metric, label)
SAID_ARGS = (("enable-prefix-caching", "vllm:cache_config_info", "enable_prefix_caching"),)


def said_args(endpoint: JsonValue) -> dict[str, bool]:
    """The arguments a server servelab did not launch runs with, as far as it says them of
    itself (launch.json `endpoint`: its /metrics info labels), in the form of a launched
    configuration's `args`: what the validity checks read (e.g. whether prefix caching was
    asked for). A setting it does not say is left out, never guessed."""
    info = endpoint.get("server_info") if isinstance(endpoint, dict) else None
    out: dict[str, bool] = {}
    for arg, metric, label in SAID_ARGS:
        labels = info.get(metric) if isinstance(info, dict) else None
        value = labels.get(label) if isinstance(labels, dict) else None
        if isinstance(value, str) and value in ("True", "False"):
            out[arg] = value == "True"
    return out


@dataclass(frozen=True)
class RawPoint:
    """One complete measured point: its point.json (`meta`), its folder, and the context the
    validity checks read: the configuration's launch arguments (server/<sc>/launch.json
    `args`) and its warm-up's point.json (raw/<sc>/warmup/), each None when absent."""

    meta: dict[str, Any]
    folder: Path
    server_args: Mapping[str, Any] | None = None
    warmup: Mapping[str, Any] | None = None
    # the point's complete re-measures (attempt 2 on, <point>/attempt-<N>/), each a RawPoint of
    # its own; which one the statistics read is the analysis' choice
    # (servelab.analysis.validity.attempts)
    remeasures: tuple[RawPoint, ...] = ()

    @property
    def attempts(self) -> tuple[RawPoint, ...]:
        """Every complete attempt of the point, the first (this one) first."""
        return (self, *self.remeasures)

    @property
    def attempt(self) -> int:
        """Which attempt this record is: point.json `attempt`, 1 when absent."""
        return int(self.meta.get("attempt") or 1)

    @property
    def server_config(self) -> str:
        return str(self.meta["server_config"])

    @property
    def level(self) -> Level:
        """The concurrency or request rate it was measured at (point.json `concurrency`, or
        `rate` for an open-loop point)."""
        return Level.from_record(self.meta)

    @property
    def requests_path(self) -> Path:
        return self.folder / REQUESTS_FILE

    def request_rows(self) -> list[JsonObject]:
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
    for path in ExperimentPaths(exp_dir).point_files():
        try:
            point = PointRecord.read(path)
        except DamagedRawData as exc:
            if skipped is None:
                raise
            skipped.append(Skipped(path.parent, exc))
            continue
        if point.status != "complete":
            continue
        ctx = context.get(point.server_config, (None, None))
        if isinstance(ctx, DamagedRawData):
            assert skipped is not None
            skipped.append(Skipped(path.parent, ctx))
            continue
        args, warmup = ctx
        again = _remeasures(path.parent, args, warmup, skipped)
        out.append(RawPoint(point.doc, path.parent, args, warmup, again))
    return out


def _remeasures(
    folder: Path,
    args: Mapping[str, JsonValue] | None,
    warmup: JsonObject | None,
    skipped: list[Skipped] | None,
) -> tuple[RawPoint, ...]:
    """A point's complete re-measures (<point>/attempt-<N>/); a damaged one raises, or with
    `skipped` is listed there and left out (the point keeps its other attempts)."""
    out = []
    for d in attempt_dirs(folder):
        try:
            point = PointRecord.read(d / POINT_FILE)
        except DamagedRawData as exc:
            if skipped is None:
                raise
            skipped.append(Skipped(d, exc))
            continue
        if point.status == "complete":
            out.append(RawPoint(point.doc, d, args, warmup))
    return tuple(out)


# a configuration's launch arguments and its warm-up's point.json
_Context = tuple[Mapping[str, JsonValue] | None, JsonObject | None]


def _launch_args(launch: LaunchRecord | None) -> Mapping[str, JsonValue] | None:
    """A configuration's launch arguments (launch.json `args`); for a server servelab did not
    launch (runtime.kind endpoint), what the server says of its settings instead."""
    if launch is None:
        return None
    if launch.doc.get("launched") is False:
        return said_args(launch.doc.get("endpoint"))
    return launch.args


def _contexts(exp_dir: Path, keep_damage: bool = False) -> dict[str, _Context | DamagedRawData]:
    """Per raw/<sc>/ folder, read once: its launch arguments and its warm-up's point.json
    (with `keep_damage`, the damage of either instead of raising it)."""
    out: dict[str, _Context | DamagedRawData] = {}
    paths = ExperimentPaths(exp_dir)
    for d in sorted(paths.raw.iterdir()) if paths.raw.is_dir() else []:
        if not d.is_dir():
            continue
        try:
            launch = LaunchRecord.read_if_present(paths.launch(d.name))
            warmup_record = WarmupRecord.read_if_present(paths.warmup_file(d.name))
        except DamagedRawData as exc:
            if not keep_damage:
                raise
            out[d.name] = exc
            continue
        out[d.name] = (
            _launch_args(launch),
            warmup_record.doc if warmup_record is not None else None,
        )
    return out
