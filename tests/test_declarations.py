"""Each JSON document servelab writes is declared once: by its JSON schema
(src/servelab/schemas/<name>.schema.json). Its TypedDicts are generated from the schema into
servelab.documents.declared (`python -m servelab.documents.generate`), and the code imports
them from there.

This module holds that together: the generated module is current; every document's schema
names the TypedDict of its top level; no module declares a TypedDict of the same name by hand;
the documents without a schema are the ones listed here; and the generator refuses what it
cannot declare (one name for two shapes, a reference to a name nothing declares).
"""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest

from servelab.documents import generate

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "servelab"
SCHEMAS = SRC / "schemas"

# documents a schema declares no TypedDict for, and why
NO_TYPEDDICT = {
    "profile.v1": "the profile format before version 2: read for old releases, never written",
}

# documents without a schema: their TypedDict is their one declaration (module, name)
SCHEMALESS = {
    "bisection.json": ("servelab.analysis.bisect", "BisectionJson"),
    "confirm.json": ("servelab.confirm", "ConfirmRecord"),
    "a venv's ready marker": ("servelab.env.runtime.venv", "VenvMarker"),
}


def declared_names() -> set[str]:
    tree = ast.parse((SRC / "documents" / "declared.py").read_text("utf-8"))
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    names |= {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    return names


def test_the_generated_module_is_current() -> None:
    current = (SRC / "documents" / "declared.py").read_text("utf-8")
    assert current == generate.generate(), (
        "src/servelab/documents/declared.py is stale: run python -m servelab.documents.generate"
    )
    assert generate.main(["--check"]) == 0


def test_every_generated_typeddict_is_a_typeddict() -> None:
    from servelab.documents import declared

    names = declared_names()
    assert len(names) > 100
    for name in sorted(names):
        cls = getattr(declared, name)
        assert typing.is_typeddict(cls), name
        typing.get_type_hints(cls)  # every annotation resolves


@pytest.mark.parametrize("schema", sorted(p.name for p in SCHEMAS.glob("*.schema.json")))
def test_each_document_names_its_typeddict(schema: str) -> None:
    doc = json.loads((SCHEMAS / schema).read_text("utf-8"))
    name = schema.removesuffix(".schema.json")
    top = doc["items"] if doc.get("type") == "array" else doc
    if name in NO_TYPEDDICT:
        assert generate.NAME_KEY not in top
        return
    assert isinstance(top.get(generate.NAME_KEY), str), (
        f"{schema}: its top level (or a list document's item) names no {generate.NAME_KEY}"
    )
    assert top[generate.NAME_KEY] in declared_names()


def test_no_module_declares_a_generated_typeddict_again() -> None:
    """A document's TypedDict lives in declared.py only: a class of the same name elsewhere
    would be a second, hand-kept declaration."""
    names = declared_names()
    again = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "documents":
            continue
        for node in ast.parse(path.read_text("utf-8")).body:
            defined = node.name if isinstance(node, ast.ClassDef) else None
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                if isinstance(func, ast.Name) and func.id == "TypedDict":
                    defined = next(t.id for t in node.targets if isinstance(t, ast.Name))
            if defined in names:
                again.append(f"{path.relative_to(ROOT)}:{node.lineno} {defined}")
    assert again == []


@pytest.mark.parametrize("document", sorted(SCHEMALESS))
def test_the_schemaless_documents_keep_their_one_typeddict(document: str) -> None:
    import importlib

    module, name = SCHEMALESS[document]
    cls = getattr(importlib.import_module(module), name)
    assert typing.is_typeddict(cls)
    assert name not in declared_names()


def _generate(schema: dict[str, object]) -> str:
    gen = generate.Generator()
    gen.annotation(schema, schema, "TestDoc", "test.schema.json")
    return gen.module()


def test_the_generator_declares_keys_types_and_requiredness() -> None:
    text = _generate(
        {
            "type": "object",
            "x-typeddict": "Thing",
            "description": "A thing.",
            "required": ["name", "parts"],
            "properties": {
                "name": {"type": "string", "description": "Its name."},
                "size": {"type": ["integer", "null"]},
                "kind": {"enum": ["a", "b"]},
                "parts": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"n": {"type": "number"}}},
                },
                "extra": {"type": "object"},
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "free": {},
            },
        }
    )
    assert "class Thing(TypedDict):" in text
    assert '"""A thing. (test.schema.json)"""' in text
    assert "    # Its name.\n    name: str\n" in text
    assert "    size: NotRequired[int | None]\n" in text
    assert "    kind: NotRequired[str]\n" in text
    assert "class ThingParts(TypedDict):" in text
    assert "    parts: list[ThingParts]\n" in text
    assert "    extra: NotRequired[Mapping[str, object]]\n" in text
    assert "    counts: NotRequired[dict[str, int]]\n" in text
    assert "    free: NotRequired[object]\n" in text


def test_the_generator_merges_branches_and_follows_refs() -> None:
    text = _generate(
        {
            "type": "object",
            "x-typeddict": "Either",
            "$defs": {"sha": {"type": "string"}},
            "oneOf": [
                {
                    "properties": {"a": {"$ref": "#/$defs/sha"}, "k": {"const": "x"}},
                    "required": ["k"],
                },
                {"properties": {"b": {"type": "integer"}, "k": {"const": "y"}}, "required": ["k"]},
            ],
        }
    )
    assert "    a: NotRequired[str]\n" in text
    assert "    b: NotRequired[int]\n" in text
    assert "    k: str\n" in text  # every branch requires it


def test_the_generator_refuses_one_name_for_two_shapes() -> None:
    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "object", "x-typeddict": "Same", "properties": {"a": {"type": "string"}}},
            "y": {
                "type": "object",
                "x-typeddict": "Same",
                "properties": {"a": {"type": "integer"}},
            },
        },
    }
    with pytest.raises(generate.SchemaError, match="Same is declared twice, differently"):
        _generate(schema)


def test_the_generator_refuses_a_reference_to_nothing() -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "object", "x-typed-as": "Nowhere"}},
    }
    with pytest.raises(generate.SchemaError, match="x-typed-as Nowhere is declared by no schema"):
        _generate(schema)


def test_a_stale_module_is_named_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    stale = tmp_path / "declared.py"
    stale.write_text("# old\n", "utf-8")
    monkeypatch.setattr(generate, "OUT", stale)
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is stale: run python -m servelab.documents.generate" in err
