"""Write `servelab.documents.declared`: the TypedDicts of the JSON documents, from their schemas.

`python -m servelab.documents.generate` rewrites src/servelab/documents/declared.py;
`python -m servelab.documents.generate --check` exits 1 where the file is stale (the tests run
it). A schema is a document's one declaration; its TypedDicts are derived from it:

- an object with properties that the schema names with `"x-typeddict": "Name"` becomes the
  TypedDict `Name`; every object with properties inside it becomes one too, named by its own
  `x-typeddict` where it has one, else by its parent's name and its key in CamelCase (an
  array's item: the array's name); an object marked `"x-typed-as": "Name"` is of the TypedDict
  `Name` that another object declares (its own properties still validate it);
- the keys are the object's properties and those its `oneOf`/`anyOf` branches and an
  `allOf`'s `then`/`else` add; a key is required where the object requires it, or every one
  of its `oneOf`/`anyOf` branches does, else `NotRequired`;
- "string" str, "integer" int, "number" float, "boolean" bool, "null" None; an `enum` or a
  `const` by its values' types (the schema checks the values); an array `list[item]`
  (`Sequence[object]` where its items have no declared shape); an object without properties
  a `dict[str, value]` of its `additionalProperties`, `Mapping[str, object]` where it says
  none; no type at all `object`; a `oneOf` or `anyOf` of types their union; `$ref`s into the
  file's `$defs` are followed;
- descriptions become the fields' comments and the classes' docstrings, so the generated
  module reads as the documents' reference.

Only schemas with an `x-typeddict` or `x-typed-as` produce classes. A name two objects declare
differently, or an `x-typed-as` no object declares, is refused in one line naming the places.
"""

from __future__ import annotations

import argparse
import json
import keyword
import re
import sys
import textwrap
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

OUT = Path(__file__).resolve().parent / "declared.py"
NAME_KEY = "x-typeddict"  # this object declares the TypedDict of that name
REF_KEY = "x-typed-as"  # this object is of the TypedDict of that name, declared elsewhere
HEADER = '''"""The TypedDicts of servelab's JSON documents, generated from their schemas
(src/servelab/schemas/<name>.schema.json) by `python -m servelab.documents.generate`.
Do not edit: change the schema and run the generator (tests/test_declarations.py checks this
file is current)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict
'''


class SchemaError(ValueError):
    pass


@dataclass
class Field:
    key: str
    annotation: str
    required: bool
    description: str = ""


@dataclass
class Declared:
    name: str
    where: str  # schema file and JSON pointer, for messages and the docstring
    description: str
    fields: list[Field] = field(default_factory=list)

    def signature(self) -> tuple[tuple[str, str, bool], ...]:
        return tuple(sorted((f.key, f.annotation, f.required) for f in self.fields))


def _list(node: dict[str, object], key: str) -> list[object]:
    value = node.get(key, [])
    return list(value) if isinstance(value, list) else []


def _dict(node: dict[str, object], key: str) -> dict[str, object]:
    value = node.get(key, {})
    return dict(value) if isinstance(value, dict) else {}


def _camel(key: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^0-9A-Za-z]+", key) if p)


class Generator:
    def __init__(self) -> None:
        self.classes: dict[str, Declared] = {}
        self.references: dict[str, str] = {}  # TypedDict name -> where a free object names it

    # --- schema walking ------------------------------------------------------------------------

    def _resolve(self, doc: dict[str, object], node: object) -> object:
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = str(node["$ref"])
            if not ref.startswith("#/"):
                raise SchemaError(f"a $ref out of the schema file: {ref}")
            target: object = doc
            for part in ref[2:].split("/"):
                assert isinstance(target, dict)
                target = target[part]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {**target, **rest} if isinstance(target, dict) else target
        return node

    def annotation(self, doc: dict[str, object], node: object, name: str, where: str) -> str:
        """The Python annotation of schema `node`; an object with properties declares the
        TypedDict `name` (or its own x-typeddict)."""
        node = self._resolve(doc, node)
        if not isinstance(node, dict) or not node:
            return "object"
        if "const" in node:
            return _literal([node["const"]])
        if "enum" in node:
            return _literal(_list(node, "enum"))
        if "type" not in node and ("properties" in node or REF_KEY in node or self._branches(node)):
            return self._one(doc, node, "object", name, where)
        branches = [b for k in ("oneOf", "anyOf") for b in _list(node, k)]
        typed = [b for b in branches if isinstance(b, dict) and ("type" in b or "$ref" in b)]
        if typed and "type" not in node:
            parts = [
                self.annotation(doc, b, f"{name}{i + 1}" if len(typed) > 1 else name, where)
                for i, b in enumerate(typed)
            ]
            return _union(parts)
        types = node.get("type")
        if types is None:
            return "object"
        parts = []
        for t in [types] if isinstance(types, str) else types:
            parts.append(self._one(doc, node, str(t), name, where))
        return _union(parts)

    def _one(
        self, doc: dict[str, object], node: dict[str, object], t: str, name: str, where: str
    ) -> str:
        scalar = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}
        if t in scalar:
            return scalar[t]
        if t == "null":
            return "None"
        if t == "array":
            items = node.get("items")
            item = name if not name.endswith("Item") else name
            ann = self.annotation(doc, items, item, where + "/items")
            # a list of JSON values of no declared shape takes any list (Sequence: covariant)
            return f"Sequence[{ann}]" if "object" in ann else f"list[{ann}]"
        if t == "object":
            if REF_KEY in node:  # an object the named TypedDict declares elsewhere
                named = str(node[REF_KEY])
                self.references.setdefault(named, where)
                return named
            if "properties" in node or self._branches(node):
                return self.declare(doc, node, name, where)
            extra = node.get("additionalProperties", True)
            if extra is True or extra == {}:
                return "Mapping[str, object]"
            at = where + "/additionalProperties"
            return f"dict[str, {self.annotation(doc, extra, f'{name}Value', at)}]"
        raise SchemaError(f"{where}: type {t!r} has no Python type")

    @staticmethod
    def _branches(node: dict[str, object]) -> list[dict[str, object]]:
        """The object branches that add keys to `node`: an `allOf`'s `then` and `else`, and
        the `oneOf`/`anyOf` branches with properties."""
        out: list[dict[str, object]] = []
        for part in _list(node, "allOf"):
            if isinstance(part, dict):
                out += [b for b in (part.get("then"), part.get("else")) if isinstance(b, dict)]
        out += [b for k in ("oneOf", "anyOf") for b in _list(node, k) if isinstance(b, dict)]
        return [b for b in out if "properties" in b]

    def declare(
        self, doc: dict[str, object], node: dict[str, object], name: str, where: str
    ) -> str:
        """Declare the TypedDict of object `node`: its own keys, and its branches' (a key is
        required where the object requires it, or every oneOf/anyOf branch does)."""
        name = str(node.get(NAME_KEY, name))
        required = {str(k) for k in _list(node, "required")}
        alternatives = [b for k in ("oneOf", "anyOf") for b in _list(node, k)]
        if alternatives and all(isinstance(b, dict) and "properties" in b for b in alternatives):
            every = [
                {str(k) for k in _list(b, "required")} for b in alternatives if isinstance(b, dict)
            ]
            required |= set.intersection(*every)
        subs: dict[str, list[object]] = {}
        for part in [node, *self._branches(node)]:
            for key, sub in _dict(part, "properties").items():
                subs.setdefault(key, []).append(sub)
        decl = Declared(name, where, str(node.get("description", "")))
        for key, options in subs.items():
            at = f"{where}/properties/{key}"
            ann = _union([self.annotation(doc, o, name + _camel(key), at) for o in options])
            desc = next(
                (
                    str(o["description"])
                    for o in options
                    if isinstance(o, dict) and "description" in o
                ),
                "",
            )
            decl.fields.append(Field(key, ann, key in required, desc))
        known = self.classes.get(name)
        if known is not None and known.signature() != decl.signature():
            raise SchemaError(
                f"{name} is declared twice, differently: at {known.where} and at {where}"
            )
        if known is None:
            self.classes[name] = decl
        return name

    # --- output --------------------------------------------------------------------------------

    def module(self) -> str:
        for named, where in self.references.items():
            if named not in self.classes:
                raise SchemaError(f"{where}: {REF_KEY} {named} is declared by no schema")
        out = [HEADER]
        for decl in self.classes.values():
            out.append(_render(decl))
        return "\n\n".join(out).rstrip() + "\n"


def _literal(values: list[object]) -> str:
    """An enum's or a const's values typed by their JSON types (the schema checks the values;
    writers build them from computed strings)."""
    names = {bool: "bool", int: "int", float: "float", str: "str", type(None): "None"}
    return _union([names.get(type(v), "object") for v in values])


def _union(parts: list[str]) -> str:
    seen: list[str] = []
    for p in parts:
        for q in p.split(" | "):
            if q not in seen:
                seen.append(q)
    if "None" in seen:  # None last, as the code writes it
        seen = [q for q in seen if q != "None"] + ["None"]
    return " | ".join(seen)


def _render(decl: Declared) -> str:
    doc = (
        f"{decl.description} ({decl.where})" if decl.description else f"An object of {decl.where}."
    )
    if any(not f.key.isidentifier() or keyword.iskeyword(f.key) for f in decl.fields):
        return _render_functional(decl, doc)
    lines = [f"class {decl.name}(TypedDict):"]
    wrapped = textwrap.wrap(doc, 92)
    if len(wrapped) == 1:
        lines.append(f'    """{wrapped[0]}"""')
    else:
        lines.append(f'    """{wrapped[0]}')
        lines += [f"    {w}" for w in wrapped[1:]]
        lines.append('    """')
    lines.append("")
    for i, f in enumerate(decl.fields):
        if f.description and i:
            lines.append("")
        lines += [f"    # {w}" for w in textwrap.wrap(f.description, 94)]
        lines.append(f"    {f.key}: {_field_annotation(f)}")
    return "\n".join(lines) + "\n"


def _field_annotation(f: Field) -> str:
    return f.annotation if f.required else f"NotRequired[{f.annotation}]"


def _render_functional(decl: Declared, doc: str) -> str:
    """A TypedDict whose keys are not all identifiers, in the functional syntax."""
    lines = [f"# {w}" for w in textwrap.wrap(doc, 98)]
    lines.append(f"{decl.name} = TypedDict(")
    lines.append(f'    "{decl.name}",')
    lines.append("    {")
    for f in decl.fields:
        lines += [f"        # {w}" for w in textwrap.wrap(f.description, 90)]
        lines.append(f"        {json.dumps(f.key)}: {_field_annotation(f)},")
    lines.append("    },")
    lines.append(")")
    return "\n".join(lines) + "\n"


def schemas() -> dict[str, dict[str, object]]:
    folder = resources.files("servelab").joinpath("schemas")
    out: dict[str, dict[str, object]] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".schema.json"):
            out[entry.name.removesuffix(".schema.json")] = json.loads(entry.read_text("utf-8"))
    return out


def _named(node: object) -> bool:
    if isinstance(node, dict):
        return NAME_KEY in node or REF_KEY in node or any(_named(v) for v in node.values())
    if isinstance(node, list):
        return any(_named(v) for v in node)
    return False


def generate() -> str:
    gen = Generator()
    for name, doc in schemas().items():
        if not _named(doc):
            continue
        gen.annotation(doc, doc, _camel(name) + "Doc", f"{name}.schema.json")
    return gen.module()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where declared.py is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        if OUT.read_text("utf-8") != text:
            print(f"{OUT} is stale: run python -m servelab.documents.generate", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, "utf-8")
    print(f"wrote {OUT} ({text.count('class ')} TypedDicts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
