"""search.json's document, as `analysis.search` writes it (`SearchResult.to_json`) and the
report and the claims read it: the spec, the path (every rate measured, with its repeats) and
the answer. `write_search` is its one writer, `read_search` its checked reader: a search read
back is checked against its schema, its spec, its steps' decisions and its answer, so a damaged
or edited file is refused in one line naming the field."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servelab.analysis.search import (
    FORMAT_VERSION,
    Answer,
    RateOutcome,
    RepeatOutcome,
    SearchResult,
    SearchSpec,
    SloBounds,
    Step,
)
from servelab.documents.declared import AnswerJson, SpecJson, StepJson
from servelab.errors import ServelabError
from servelab.store.jsonio import json_path, load_schema, write_json
from servelab.store.records import DamagedRawData, read_raw

__all__ = ["read_search", "search_from_json", "write_search"]

_TODO = "re-run the search"


def write_search(path: Path, result: SearchResult) -> None:
    """Write search.json (same result, same bytes)."""
    write_json(path, result.to_json())


@functools.cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema("search"))


def read_search(path: Path) -> SearchResult:
    """The search in search.json at `path`, checked: against its schema (every field it
    requires, at every depth), then that it is the format version this servelab reads, that its
    spec is a valid one, that its steps are numbered from 1 in order, each with the decision
    (and the counts) its repeats and the spec's target say, measured again while undecided up
    to max_rounds, and that the answer is the path's. Damage raises DamagedRawData (a
    ServelabError): one line naming the file and the field."""
    return search_from_json(read_raw(path, _TODO), path)


def search_from_json(doc: Any, path: Path) -> SearchResult:
    """The search of a search.json document read from `path`, checked as `read_search` says."""
    version = doc.get("format_version", FORMAT_VERSION) if isinstance(doc, dict) else None
    if version != FORMAT_VERSION and version is not None:
        what = f"{version!r} is not a version this servelab reads ({FORMAT_VERSION})"
        todo = "upgrade servelab or re-run the search"
        if isinstance(version, int) and version < FORMAT_VERSION:
            todo = "its repeats were each decided alone, without early stopping: re-run the search"
        raise DamagedRawData(path, "$.format_version", what, todo)
    _check_schema(doc, path)
    spec = _spec_of(doc["spec"], path)
    steps = [_step_of(s, i, spec, path) for i, s in enumerate(doc["path"])]
    return SearchResult(spec, tuple(steps), _answer_of(doc["answer"], steps, path))


def _step_of(s: StepJson, i: int, spec: SearchSpec, path: Path) -> Step:
    """Step `i` of a search.json's path, checked: its order, its repeats, its decision and
    counts (recomputed from the repeats), its rounds."""
    where = f"$.path[{i}]"
    if s["order"] != i + 1:
        what = f"{s['order']!r}, where {i + 1} follows the steps before it"
        raise DamagedRawData(path, f"{where}.order", what, _TODO)
    repeats = []
    for j, r in enumerate(s["repeats"]):
        try:
            repeats.append(
                RepeatOutcome(r["attainment"], r["valid"], r["requests"], tuple(r["reasons"]))
            )
        except ServelabError as exc:
            raise DamagedRawData(path, f"{where}.repeats[{j}]", str(exc), _TODO) from None
    outcome = RateOutcome(tuple(repeats))
    d = outcome.decide(spec.target, spec.confidence)
    for name, given, want in (
        ("decision", s["decision"], d.decision),
        ("requests", s["requests"], d.n),
        ("over", s["over"], d.k),
    ):
        if given != want:
            what = f"{given!r}, where its repeats and the target {spec.target:g} say {want!r}"
            raise DamagedRawData(path, f"{where}.{name}", what, _TODO)
    rounds = s["rounds"]
    if rounds > spec.max_rounds or (d.decision == "undecided" and rounds < spec.max_rounds):
        what = (
            f"{rounds!r}, where an undecided rate is measured again up to max_rounds "
            f"{spec.max_rounds} and no further"
        )
        raise DamagedRawData(path, f"{where}.rounds", what, _TODO)
    return Step(s["order"], s["phase"], float(s["rate"]), outcome, d, rounds)


def _check_schema(doc: Any, path: Path) -> None:
    if not isinstance(doc, dict):
        raise DamagedRawData(path, "$", f"a {type(doc).__name__}, not a JSON object", _TODO)
    errors = []
    for err in _validator().iter_errors(doc):
        where, what = json_path(err.absolute_path), err.message
        if err.validator == "required" and isinstance(err.instance, dict):
            missing = [k for k in err.validator_value if k not in err.instance]
            if missing:
                where, what = f"{where}.{missing[0]}", "required field missing"
        errors.append((where, what))
    if errors:
        where, what = min(errors)
        raise DamagedRawData(path, where, f"{what} (schema search.schema.json)", _TODO)


def _answer_of(a: AnswerJson, steps: Sequence[Step], path: Path) -> Answer:
    """The answer of a search.json, which must be its path's: the highest rate that met, the
    lowest that did not, the rates left undecided."""
    undecided = tuple(float(r) for r in a["undecided_rates"])
    answer = Answer(
        _opt_float(a["met_rate"]),
        _opt_float(a["failed_rate"]),
        a["stopped"],
        a["reason"],
        undecided,
    )
    met = max((s.rate for s in steps if s.meets), default=None)
    failed = min((s.rate for s in steps if not s.meets), default=None)
    left = tuple(s.rate for s in steps if s.decision.decision == "undecided")
    for name, have, want, given in (
        ("met_rate", answer.met_rate, met, a["met_rate"]),
        ("failed_rate", answer.failed_rate, failed, a["failed_rate"]),
        ("undecided_rates", list(answer.undecided), list(left), a["undecided_rates"]),
    ):
        if have != want:
            what = f"{given!r}, where the path says {want!r}"
            raise DamagedRawData(path, f"$.answer.{name}", what, _TODO)
    return answer


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _spec_of(d: SpecJson, path: Path) -> SearchSpec:
    """The spec of a search.json, valid (DamagedRawData naming the field otherwise)."""
    b = d["bounds"]
    try:
        bounds = SloBounds(
            _opt_float(b["ttft_ms"]), _opt_float(b["tpot_ms"]), _opt_float(b["e2el_ms"])
        )
    except ServelabError as exc:
        raise DamagedRawData(path, "$.spec.bounds", str(exc), _TODO) from None
    try:
        return SearchSpec(
            start_rate=float(d["start_rate"]),
            bounds=bounds,
            target=float(d["target"]),
            growth=float(d["growth"]),
            tolerance=float(d["tolerance"]),
            max_measurements=d["max_measurements"],
            min_rate=_opt_float(d["min_rate"]),
            max_rate=_opt_float(d["max_rate"]),
            resolution=_opt_float(d["resolution"]),
            max_rounds=d["max_rounds"],
            confidence=float(d["confidence"]),
        )
    except ServelabError as exc:
        _, name, what = str(exc).split(" ", 2)  # "search <field> <value>: ..."
        raise DamagedRawData(path, f"$.spec.{name}", what, _TODO) from None
