"""Building the typed experiment's sections from a validated config dict: each dataclass field
from the key of its name, by its type hint (a nested section, a tuple, a read-only mapping), a
key the config may leave out (`ABSENT_AS_NONE`) as None, any other missing key refused."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping

from servelab.errors import ServelabError

_T = typing.TypeVar("_T")


def section_from_dict(cls: type[_T], data: Mapping[str, object], where: str) -> _T:
    """One section from its validated dict, e.g. `section_from_dict(ValiditySection,
    d, "analysis.validity")`."""
    return _build(cls, data, where)


def _build(cls: type[_T], data: object, where: str) -> _T:
    if not isinstance(data, Mapping):
        raise ServelabError(f"config {where or '(top level)'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    if not dataclasses.is_dataclass(cls):  # the error dataclasses.fields raises for it
        raise TypeError("must be called with a dataclass type or instance")
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        key = f"{where}.{f.name}" if where else f.name
        if f.name not in data and f.name in getattr(cls, "ABSENT_AS_NONE", ()):
            kwargs[f.name] = None  # a key the config gives only for one kind of sweep
            continue
        if f.name not in data:
            raise ServelabError(
                f"config {key}: missing; build an Experiment from config.validate(), which "
                "fills the schema's defaults"
            )
        kwargs[f.name] = _value(hints[f.name], data[f.name], key)
    return cls(**kwargs)


def _value(hint: object, value: object, where: str) -> object:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) > 1 and isinstance(value, Mapping):  # e.g. int | RoundsSection
            inner = [a for a in inner if dataclasses.is_dataclass(a)] or inner
        return _value(inner[0], value, where) if len(inner) == 1 else value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # the schema's "number": 2 and 2.0 are the same setting
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin is tuple:
        if not isinstance(value, Iterable):
            raise ServelabError(f"config {where}: expected a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_value(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise ServelabError(f"config {where}: expected a mapping, got {value!r}")
        return types.MappingProxyType(copy.deepcopy(dict(value)))
    return value
