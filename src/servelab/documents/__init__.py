"""The shapes of the JSON documents servelab writes and reads.

`JsonValue` and `JsonObject` type a JSON value whose shape is not (yet) known: what
`json.loads` returns before a schema has been checked. A reader narrows them (isinstance) or,
once the document's schema has been checked, reads it as its declared TypedDict.

The TypedDicts of the documents themselves are generated from their JSON schemas
(src/servelab/schemas/<name>.schema.json) into `servelab.documents.declared`:
`python -m servelab.documents.generate` writes it, and tests/test_declarations.py fails where it
is stale. A schema is a document's one declaration.
"""

from __future__ import annotations

from typing import TypeAlias

JsonScalar: TypeAlias = str | int | float | bool | None
JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = dict[str, "JsonValue"]

__all__ = ["JsonObject", "JsonScalar", "JsonValue"]
