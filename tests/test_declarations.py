"""Each JSON document servelab writes is declared twice: as a TypedDict beside its writer and
as a JSON schema (src/servelab/schemas/<name>.schema.json). This module holds the two together.

`PAIRS` pairs a schema's object (the document, a list document's item, or an object inside
one) with the TypedDict that declares it. For each pair, and for every object both sides
declare inside it (a field typed by a TypedDict, a list of them or a mapping to them, whose
schema is an object with `properties` or `required`), recursively:

- keys: the TypedDict's keys are the schema's (`properties` and `required`, its oneOf and anyOf
  branches' too); of an object the schema leaves free-form (no properties, more allowed) only
  the required keys are checked;
- required: every key the schema requires is a required key of the TypedDict, or one its
  writer always writes (`ALWAYS_WRITTEN`);
- types: a field's JSON types agree (str "string", int "integer", float "number", bool
  "boolean", None "null", a list "array", a dict or TypedDict "object"; a union and a list of
  types as sets). An int agrees with a schema's "number"; Any and object are not checked;
  null the schema admits beyond the TypedDict agrees where `NULL_ADMITTED` says why.

What does not pair: `UNPAIRED` lists each document whose top level has no TypedDict or no
schema, and `KNOWN` each difference that would need a change of what a writer writes, each
with its reason; every entry of the four tables is checked for staleness.
"""

from __future__ import annotations

import collections.abc
import json
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin

import pytest

from servelab.analysis.bisect import BisectionJson
from servelab.analysis.claims import ClaimVerdict
from servelab.analysis.confirmation import ConfirmationRecord
from servelab.analysis.diagnosis_records import Diagnosis
from servelab.analysis.knee import Knee
from servelab.analysis.rounds import RoundsRecord
from servelab.analysis.runtimes import RuntimesJson
from servelab.analysis.samehost import SameHostJson
from servelab.analysis.search_records import SearchJson
from servelab.analysis.validity.attempts import RecordJson
from servelab.analysis.validity.flags import FlagJson
from servelab.client.closed_loop import WorkerStats
from servelab.confirm import ConfirmRecord
from servelab.env.compilecache import CacheFiles
from servelab.env.container.gpus import GpuChoiceJson
from servelab.env.endpoint import EndpointCapacity, EndpointFacts, EndpointRecord
from servelab.env.runtime import VenvRecord
from servelab.env.runtime.image import ContainerRecord
from servelab.env.runtime.venv import VenvMarker
from servelab.evidence.documents import Manifest, Provenance
from servelab.hostfacts.canary import RunCanaryJson
from servelab.hostfacts.host import HostFacts, NodeFacts
from servelab.hostfacts.isa import IsaRecord
from servelab.launch.hostlock import LockRecord
from servelab.launch.serverlog import StartRecord
from servelab.launch.session import LaunchCapacity, LaunchJson
from servelab.measure.point import ChatBlock, DatasetBlock
from servelab.measure.sequential import SequentialRecord
from servelab.profile.records import NsysReport, ProfileRecord
from servelab.reproduce.records import ReproductionRecord
from servelab.telemetry.summary import EnergySummary, TelemetryDisabled, TelemetrySummary
from servelab.workload.synthetic import IntendedReuse

SCHEMAS = Path(__file__).resolve().parents[1] / "src" / "servelab" / "schemas"


@dataclass(frozen=True)
class Pair:
    """A schema's object (`at`: a JSON pointer into the schema file, "" for the document,
    "/items" for a list document's item) and the TypedDict(s) that declare it; several: the
    document is written as any one of them."""

    schema: str
    types: tuple[type, ...]
    at: str = ""

    @property
    def path(self) -> str:
        """The object's JSON path in the document ($, $[*], $.canary, ...)."""
        return "$" + self.at.replace("/properties/", ".").replace("/items", "[*]")

    @property
    def name(self) -> str:
        return f"{self.schema} {self.path} {'|'.join(t.__name__ for t in self.types)}"


PAIRS: list[Pair] = [
    # the bundle's documents
    Pair("manifest", (Manifest,)),
    Pair("provenance", (Provenance,)),
    Pair("provenance", (HostFacts,), "/properties/host"),
    Pair("provenance", (GpuChoiceJson,), "/properties/runtime/properties/gpu_choice"),
    Pair("provenance", (IsaRecord,), "/properties/runtime/properties/isa"),
    # the analysis's tables
    Pair("claims", (ClaimVerdict,), "/items"),
    Pair("diagnoses", (Diagnosis,), "/items"),
    Pair("knee", (Knee,), "/items"),
    Pair("confirmation", (ConfirmationRecord,)),
    Pair("rounds", (RoundsRecord,)),
    Pair("same_host", (SameHostJson,)),
    Pair("runtimes", (RuntimesJson,)),
    Pair("validity", (FlagJson,), "/properties/points/items/properties/checks/items"),
    Pair("validity", (RecordJson,), "/properties/points/items/properties/record"),
    # a reproduction
    Pair("reproduction", (ReproductionRecord,)),
    # the raw layout
    Pair("search", (SearchJson,)),
    Pair("run", (RunCanaryJson,), "/properties/canary"),
    Pair("run", (SequentialRecord,), "/properties/sequential"),
    Pair("launch", (LaunchJson,)),
    Pair("launch", (StartRecord,), "/properties/start"),
    Pair("launch", (LockRecord,), "/properties/lock"),
    Pair("launch", (EndpointFacts,), "/properties/endpoint"),
    Pair("launch", (CacheFiles,), "/properties/compile_cache/properties/vllm"),
    Pair("launch", (CacheFiles,), "/properties/compile_cache/properties/inductor"),
    Pair("capacity", (LaunchCapacity, EndpointCapacity)),
    Pair("capture", (StartRecord,), "/properties/start"),
    Pair("capture", (LockRecord,), "/properties/lock"),
    Pair("capture", (NodeFacts,), "/properties/node"),
    Pair("capture", (NsysReport,), "/properties/nsys_report"),
    Pair("capture", (CacheFiles,), "/properties/compile_cache/properties/vllm"),
    Pair("capture", (CacheFiles,), "/properties/compile_cache/properties/inductor"),
    Pair("profile", (ProfileRecord,)),
    Pair("runtime", (VenvRecord, ContainerRecord, EndpointRecord)),
    Pair("telemetry", (TelemetrySummary, TelemetryDisabled)),
    Pair("point", (EnergySummary,), "/properties/telemetry/properties/energy"),
    Pair("point", (ChatBlock,), "/properties/chat"),
    Pair("point", (DatasetBlock,), "/properties/dataset"),
    Pair("point", (IntendedReuse,), "/properties/shared_prefix"),
    Pair("point", (WorkerStats,), "/properties/client_workers/items"),
]

# (schema, JSON path of a key): why a key the schema requires, and its TypedDict marks
# NotRequired, is always written
ALWAYS_WRITTEN: dict[tuple[str, str], str] = {
    ("reproduction", "$.verdict_text"): "compare_sides writes it; NotRequired for reproductions "
    "made before it was recorded, which their readers still read",
    ("reproduction", "$.host"): "compare_sides writes it; NotRequired for reproductions made "
    "before it was recorded, which their readers still read",
    ("reproduction", "$.host.qualifier"): "compare_sides sets it; compare_hosts, which returns "
    "the HostComparison, does not",
    ("profile", "$.ratios[*].paths"): "_between_windows sets it on every row `ratios` returns",
    ("profile", "$.localisation[*].components[*].share"): "localise sets it on every row once "
    "the rows' deltas are summed",
    ("profile", "$.windows.*.steady.paths"): "_window_entry sets it on every steady state "
    "steady_summary returns",
}

# (schema, JSON path prefix): why the schema admits null where the TypedDict does not
NULL_ADMITTED: dict[tuple[str, str], str] = {
    ("telemetry", "$"): "telemetry.schema.json admits null for each block and statistic, as "
    "the reader of raw points checks them; summarize writes objects and numbers there",
    ("point", "$.telemetry.energy.window_s"): "point.schema.json admits null; summarize writes "
    "the window's length",
    ("runtime", "$.isa"): "runtime.schema.json admits null; ensure_runtime writes the probe's "
    "record (its `error` says why where the probe failed)",
    ("runtime", "$.vllm_cli"): "runtime.schema.json admits null; the writers write a bool",
    ("profile", "$.trace.gpus[*].name"): "profile.schema.json admits null; match_gpus writes "
    "the name the trace gives",
}


@dataclass(frozen=True)
class Unpaired:
    """A document whose top level has no TypedDict (`lacks` "TypedDict": `name` is its
    schema's) or no schema (`lacks` "schema": `name` is the schema it would have), and why."""

    name: str
    lacks: Literal["TypedDict", "schema"]
    reason: str


UNPAIRED: list[Unpaired] = [
    Unpaired("arrivals", "TypedDict", "ArrivalsRecord.of builds it as a dict"),
    Unpaired("capture", "TypedDict", "profile.capture keeps it as a dict; its blocks pair above"),
    Unpaired("dataset", "TypedDict", "workload.datasets builds it as a dict"),
    Unpaired("intoto", "TypedDict", "evidence.crate builds the statement as a dict"),
    Unpaired("model", "TypedDict", "env.model builds the model record as a dict"),
    Unpaired("point", "TypedDict", "measure.point builds it from dicts; its blocks pair above"),
    Unpaired("profile.v1", "TypedDict", "an older format's schema; ProfileRecord is the current"),
    Unpaired("run", "TypedDict", "SweepJob.write_run builds it as a dict; its blocks pair above"),
    Unpaired("slo", "TypedDict", "analysis.slo builds it as a dict"),
    Unpaired("trace", "TypedDict", "workload.promptset builds it as a dict"),
    Unpaired(
        "turns", "TypedDict", "rows of level, turn, repeats beside TurnStats (analysis.turns)"
    ),
    Unpaired("validity", "TypedDict", "validity_json builds it as a dict; its blocks pair above"),
    Unpaired("windows", "TypedDict", "profile.windows builds it as a dict"),
    Unpaired("bisection", "schema", "bisection.json: BisectionJson (analysis.bisect) only"),
    Unpaired("confirm", "schema", "confirm.json: ConfirmRecord (servelab.confirm) only"),
    Unpaired("venv_ready", "schema", "a venv's ready marker in the cache: VenvMarker only"),
]
# the TypedDicts of the documents without a schema (imported, so a renamed one fails here)
SCHEMALESS = {"bisection": BisectionJson, "confirm": ConfirmRecord, "venv_ready": VenvMarker}

# (schema, JSON path of a key): why the difference stays (a fix would change what is written,
# or how the writers' types read)
KNOWN: dict[tuple[str, str], str] = {
    ("capacity", "$.server_config"): "SweepJob.started writes it beside the facts of "
    "Session.capacity, which the TypedDicts declare",
    ("provenance", "$.endpoint.url"): "copied from runtime.json's url, which runtime.schema.json "
    "requires of an endpoint runtime; read with .get, so typed str | None",
    ("provenance", "$.endpoint.served_model"): "copied from runtime.json's served_model, which "
    "runtime.schema.json requires of an endpoint runtime; read with .get, so typed str | None",
    ("reproduction", "$.orderings[*].verdict"): "orderings are the judged rows of `paired` "
    "(PairCheck, shared), whose verdict is never None (pair_rows)",
    ("runtime", "$.image"): "a container runtime's image, which parse_image requires; typed "
    "as RuntimeSection.image (str | None)",
    ("knee", "$[*].concurrency"): "a level is LevelValue (int | float); a concurrency is an "
    "integer",
    ("diagnoses", "$[*].concurrency"): "a level is LevelValue (int | float); a concurrency is "
    "an integer",
    ("reproduction", "$.points[*].concurrency"): "a level is LevelValue (int | float); a "
    "concurrency is an integer",
}


# --- the TypedDict side ------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    """`tp` without NotRequired, Required and Annotated."""
    while get_origin(tp) in (NotRequired, Required, typing.Annotated):
        tp = get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[Any]:
    """The members of a union (the type alone otherwise), NewTypes as their supertype."""
    tp = _unwrap(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in _members(a)]
    while hasattr(tp, "__supertype__"):
        tp = tp.__supertype__
    return [tp]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_ARRAYS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_SCALARS = (("boolean", bool), ("integer", int), ("number", float), ("string", str))


def td_types(tp: Any) -> frozenset[str] | None:
    """The JSON types a value annotated `tp` takes; None where it is not known (Any,
    object)."""
    out: set[str] = set()
    for m in _members(tp):
        origin = get_origin(m) or m
        scalar = [j for j, py in _SCALARS if isinstance(m, type) and issubclass(m, py)]
        if m is Any or m is object:
            return None
        if origin is Literal:
            out |= {_json_type(v) for v in get_args(m)}
        elif m is type(None):
            out.add("null")
        elif typing.is_typeddict(m) or origin in _OBJECTS:
            out.add("object")
        elif origin in _ARRAYS:
            out.add("array")
        elif scalar:
            out.add(scalar[0])
        else:
            return None
    return frozenset(out)


@dataclass(frozen=True)
class TdShape:
    """The keys of one or more TypedDicts (a union): each key's annotations, and the keys
    required in every one of them."""

    names: str
    keys: dict[str, list[Any]]
    required: frozenset[str]


@cache
def _hints(td: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's annotations and its required keys. __required_keys__ and
    __optional_keys__ follow each class's totality; NotRequired and Required written as strings
    (`from __future__ import annotations`) are read from the evaluated annotations."""
    hints = typing.get_type_hints(td, include_extras=True)
    required = set(td.__required_keys__) - set(td.__optional_keys__)
    for key, tp in hints.items():
        if get_origin(tp) is NotRequired:
            required.discard(key)
        elif get_origin(tp) is Required:
            required.add(key)
    return hints, frozenset(required)


def td_shape(tds: tuple[type, ...]) -> TdShape:
    keys: dict[str, list[Any]] = {}
    required: frozenset[str] | None = None
    for td in tds:
        hints, req = _hints(td)
        for key, tp in hints.items():
            keys.setdefault(key, []).append(tp)
        required = req if required is None else required & req
    return TdShape("|".join(t.__name__ for t in tds), keys, required or frozenset())


# --- the schema side ---------------------------------------------------------------------------


@cache
def schema_doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    return doc


def pointer(doc: Any, at: str) -> Any:
    """The node at JSON pointer `at` of `doc`."""
    node = doc
    for part in at.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def resolve(doc: dict[str, Any], node: Any) -> Any:
    """`node` with its `$ref`s within the schema file followed ($defs, definitions, any
    pointer)."""
    for _ in range(50):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        ref = node["$ref"]
        assert ref.startswith("#"), f"a $ref out of the schema file: {ref}"
        node = {**pointer(doc, ref[1:]), **{k: v for k, v in node.items() if k != "$ref"}}
    raise AssertionError(f"a $ref cycle at {node.get('$ref')}")


def _branches(doc: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        resolve(doc, b) for k in ("oneOf", "anyOf") for b in node.get(k, []) if isinstance(b, dict)
    ]


def schema_types(doc: dict[str, Any], node: Any) -> frozenset[str] | None:
    """The JSON types a schema node admits; None where it does not say."""
    node = resolve(doc, node)
    if not isinstance(node, dict):
        return None
    if "type" in node:
        t = node["type"]
        return frozenset([t] if isinstance(t, str) else t)
    if "const" in node:
        return frozenset([_json_type(node["const"])])
    if "enum" in node:
        return frozenset(_json_type(v) for v in node["enum"])
    found = [schema_types(doc, b) for b in _branches(doc, node)]
    if not found or any(f is None for f in found):
        return None
    return frozenset().union(*(f for f in found if f is not None))


@dataclass(frozen=True)
class SchemaShape:
    """An object of a schema: each key's subschemas (its own and its oneOf/anyOf branches'),
    the keys it requires (its own, and those every branch requires), whether it is free-form
    (no properties, more allowed)."""

    props: dict[str, list[Any]]
    required: frozenset[str]
    free: bool


def schema_shape(doc: dict[str, Any], node: Any) -> SchemaShape | None:
    """The object `node` declares; None where it declares no keys."""
    node = resolve(doc, node)
    if not isinstance(node, dict):
        return None
    props: dict[str, list[Any]] = {}
    for k, v in node.get("properties", {}).items():
        props.setdefault(k, []).append(v)
    required = set(node.get("required", []))
    every: frozenset[str] | None = None
    for b in _branches(doc, node):
        for k, v in b.get("properties", {}).items():
            props.setdefault(k, []).append(v)
        req = frozenset(b.get("required", []))
        every = req if every is None else every & req
    required |= every or frozenset()
    if not props and not required:
        return None
    free = not props and node.get("additionalProperties", True) is not False
    return SchemaShape(props, frozenset(required), free)


# --- the check ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A difference between a schema and a TypedDict, at the JSON path of a key."""

    schema: str
    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.schema}.schema.json {self.path}: {self.what}"


def _nested(tp: Any) -> tuple[str, tuple[type, ...]] | None:
    """Where a field annotated `tp` holds TypedDicts: ("", tds) itself, ("[*]", tds) a list of
    them, (".*", tds) a mapping to them; None where it holds none, or not only them."""
    ms = [m for m in _members(tp) if m is not type(None)]
    if ms and all(typing.is_typeddict(m) for m in ms):
        return "", tuple(ms)
    if len(ms) == 1:
        origin, args = get_origin(ms[0]), get_args(ms[0])
        inner = None
        if origin in _ARRAYS and len(args) == 1:
            inner, how = _nested(args[0]), "[*]"
        elif origin in _OBJECTS and len(args) == 2:
            inner, how = _nested(args[1]), ".*"
        if inner is not None and inner[0] == "":
            return how, inner[1]
    return None


def _sub(doc: dict[str, Any], node: Any, how: str) -> Any:
    """The schema of `node` itself (""), of its items ("[*]") or of its values (".*")."""
    node = resolve(doc, node)
    if not isinstance(node, dict):
        return None
    if how == "[*]":
        return node.get("items")
    if how == ".*":
        more = node.get("additionalProperties")
        return more if isinstance(more, dict) else None
    return node


class Checker:
    """Compares schemas with TypedDicts; `found`: every difference, `pairs`: every object pair
    compared (nested ones included)."""

    def __init__(self, always: dict[tuple[str, str], str] | None = None) -> None:
        self.always = ALWAYS_WRITTEN if always is None else always
        self.found: list[Finding] = []
        self.pairs: set[str] = set()

    def pair(self, pair: Pair) -> None:
        self.check(pair.schema, pointer(schema_doc(pair.schema), pair.at), pair.types, pair.path)

    def check(self, schema: str, node: Any, tds: tuple[type, ...], path: str) -> None:
        """The schema object `node` at `path` against the TypedDicts `tds`."""
        doc = schema_doc(schema)
        shape, td = schema_shape(doc, node), td_shape(tds)
        self.pairs.add(f"{schema} {path} {td.names}")
        if shape is None:
            self.found.append(
                Finding(schema, path, f"the schema declares no keys; {td.names} does")
            )
            return
        declared = set(shape.props) | shape.required
        ours = set(td.keys)
        if shape.free:
            for key in sorted(shape.required - ours):
                self.add(schema, f"{path}.{key}", f"the schema requires it; {td.names} lacks it")
        else:
            for key in sorted(ours - declared):
                self.add(schema, f"{path}.{key}", f"{td.names} has it; the schema does not")
            for key in sorted(declared - ours):
                self.add(schema, f"{path}.{key}", f"the schema has it; {td.names} does not")
        for key in sorted(shape.required & ours - td.required):
            if (schema, f"{path}.{key}") not in self.always:
                self.add(
                    schema,
                    f"{path}.{key}",
                    f"the schema requires it; {td.names} has it NotRequired (mark it required, "
                    "or list it in ALWAYS_WRITTEN where its writer always writes it)",
                )
        for key in sorted(ours & set(shape.props)):
            self.field(schema, shape.props[key], td.keys[key], td.names, f"{path}.{key}")

    def add(self, schema: str, path: str, what: str) -> None:
        self.found.append(Finding(schema, path, what))

    def field(
        self, schema: str, subs: list[Any], annotations: list[Any], names: str, where: str
    ) -> None:
        """A key both sides declare: its JSON types, then the objects inside it."""
        doc = schema_doc(schema)
        theirs_all = [schema_types(doc, s) for s in subs]
        ours_all = [td_types(a) for a in annotations]
        if None not in theirs_all and None not in ours_all:
            theirs = frozenset().union(*(t for t in theirs_all if t is not None))
            ours = frozenset().union(*(t for t in ours_all if t is not None))
            if "number" in theirs and "integer" not in theirs:
                ours = frozenset("number" if t == "integer" else t for t in ours)
            if ours | {"null"} == theirs and _null_admitted(schema, where):
                ours = theirs
            if ours != theirs:
                self.add(
                    schema,
                    where,
                    f"types differ: {names} says {sorted(ours)}, the schema {sorted(theirs)}",
                )
        inner = [_nested(a) for a in annotations]
        hows = {i[0] for i in inner if i is not None}
        if len(subs) != 1 or None in inner or len(hows) != 1:
            return
        how = hows.pop()
        tds = tuple(dict.fromkeys(t for i in inner if i is not None for t in i[1]))
        sub = _sub(doc, subs[0], how)
        if sub is not None and schema_shape(doc, sub) is not None:
            self.check(schema, sub, tds, where + how)


def _null_admitted(schema: str, where: str) -> bool:
    return any(s == schema and where.startswith(p) for s, p in NULL_ADMITTED)


def run_all(always: dict[tuple[str, str], str] | None = None) -> Checker:
    checker = Checker(always)
    for pair in PAIRS:
        checker.pair(pair)
    return checker


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_typeddict_agrees_with_its_schema(pair: Pair) -> None:
    """The TypedDict and the schema declare the same keys, required where the schema requires
    them, of the same JSON types; the objects inside likewise."""
    checker = Checker()
    checker.pair(pair)
    left = [f for f in checker.found if (f.schema, f.path) not in KNOWN]
    assert not left, "\n".join(map(str, left))


def test_refs_resolve_within_the_schema_file() -> None:
    """A $ref to $defs is followed (dataset.schema.json's `filter` and `lengths`)."""
    doc = schema_doc("dataset")
    bound = pointer(doc, "/properties/filter/properties/max_model_len")
    assert schema_types(doc, bound) == {"integer", "null"}
    shape = schema_shape(doc, pointer(doc, "/properties/lengths/properties/input_tokens"))
    assert shape is not None and set(shape.props) == {"min", "p50", "mean", "max"}


def test_known_differences_still_differ() -> None:
    found = {(f.schema, f.path) for f in run_all().found}
    stale = sorted(k for k in KNOWN if k not in found)
    assert not stale, f"KNOWN entries that no longer differ (remove them): {stale}"


def test_always_written_keys_are_still_not_required() -> None:
    """Each ALWAYS_WRITTEN key is still required by its schema and NotRequired in its
    TypedDict."""
    found = {(f.schema, f.path) for f in run_all({}).found if "NotRequired" in f.what}
    stale = sorted(k for k in ALWAYS_WRITTEN if k not in found)
    assert not stale, f"ALWAYS_WRITTEN entries that no longer apply (remove them): {stale}"


def test_null_admitted_still_applies() -> None:
    """Each NULL_ADMITTED entry still covers a key whose schema admits null and whose
    TypedDict does not."""
    saved = dict(NULL_ADMITTED)
    NULL_ADMITTED.clear()
    try:
        found = run_all().found
    finally:
        NULL_ADMITTED.update(saved)
    stale = sorted(
        (s, p)
        for s, p in saved
        if not any(
            f.schema == s and f.path.startswith(p) and "types differ" in f.what for f in found
        )  # fmt: skip
    )
    assert not stale, f"NULL_ADMITTED entries that no longer apply (remove them): {stale}"


def test_every_document_is_paired_or_listed() -> None:
    """Every schema's top level pairs with a TypedDict or is listed in UNPAIRED; an UNPAIRED
    entry still lacks its side: a schema listed without a TypedDict has none in PAIRS, a
    document listed without a schema has no schema file and its TypedDict in SCHEMALESS."""
    names = {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")}
    top = {p.schema for p in PAIRS if p.at in ("", "/items")}
    listed = {u.name for u in UNPAIRED if u.lacks == "TypedDict"}
    missing = sorted(names - top - listed)
    assert not missing, f"schemas with no TypedDict in PAIRS and no UNPAIRED entry: {missing}"
    stale = sorted(n for n in listed if n in top or n not in names)
    stale += sorted(
        u.name
        for u in UNPAIRED
        if u.lacks == "schema" and (u.name in names or u.name not in SCHEMALESS)
    )
    assert not stale, f"UNPAIRED entries that no longer apply (remove them): {stale}"
