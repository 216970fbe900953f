"""Strict JSON for records and answers: non-finite floats become the strings "nan", "inf",
"-inf" (JSON has no such numbers); a record (a dataclass) becomes the object of its fields in
order, or its own `to_json()` where it has one (a field left out while None); anything else
that is not a JSON value becomes its str().

`Record` is the one codec for dataclasses kept as JSON objects and read back (a finding's
evidence and its parts, a captured stack): field names are the keys, in order; a field made
with `optional()` is left out while None; reading back is tolerant of other versions (keys
this version does not know are kept in `extra` and written again after the known ones, a key
a row lacks takes its default, None for a field without one) and builds the nested records
its fields' annotations name (`StackFrame`, `list[ThreadStack] | None`, `dict[str, Part]`):
a class with its own `from_json` (a Record) through it, a plain dataclass from its own fields
(other keys dropped); written back through the part's own `to_json` where it has one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")
_OMIT = {"omit_none": True}
_LAST = {"after_extra": True}


def optional(default: Any = None) -> Any:
    """A record's field written to the JSON only when it is not None."""
    return dataclasses.field(default=default, metadata=_OMIT)


def trailing() -> Any:
    """A record's field written after the unknown keys, and only when it is not None."""
    return dataclasses.field(default=None, repr=False, metadata=_LAST)


@dataclasses.dataclass(kw_only=True)
class Record:
    # Keys this version does not know (a row written by another version): kept as they came.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the fields in order, then the unknown keys, then trailing fields."""
        out: dict[str, Any] = {}
        last: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.metadata.get("omit_none")):
                continue
            if f.metadata.get("after_extra"):
                if value is not None:
                    last[f.name] = value
                continue
            out[f.name] = _plain(value)
        out.update(self.extra)
        out.update(last)
        return out

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record from its JSON form, tolerant of other versions' rows."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = {str(k): v for k, v in data.items() if k not in known}
        return cls(**field_values(cls, data), extra=extra)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """A record class's field annotations, resolved once."""
    if cls not in _HINTS:
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except (NameError, TypeError):  # a name only a type checker sees: read values as they are
            _HINTS[cls] = {}
    return _HINTS[cls]


def decode_as(annotation: Any, value: Any) -> Any:
    """A JSON value read as `annotation` says (`list[StackFrame] | None`): its nested records
    built, any other value as it came."""
    if value is None:
        return None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return decode_as(kinds[0], value) if len(kinds) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation)
        return [decode_as(item, v) for v in value]
    if origin is dict and isinstance(value, Mapping):
        _key, item = typing.get_args(annotation)
        return {k: decode_as(item, v) for k, v in value.items()}
    if origin is not None or not isinstance(value, Mapping) or not isinstance(annotation, type):
        return value
    reader = getattr(annotation, "from_json", None)  # a Record's, or a class's own
    if callable(reader):
        return reader(value)
    if dataclasses.is_dataclass(annotation):
        return annotation(**field_values(annotation, value))
    return value


def field_values(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """A dataclass's field values from a JSON object, other keys left out: each read as its
    annotation says (nested records built), and None for a field without a default that the
    object lacks (a key an older row lacks); a field with a default that it lacks is left to
    its default."""
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        if f.name in data:
            values[f.name] = decode_as(hints.get(f.name, Any), data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return values


def _plain(value: Any) -> Any:
    """A field's JSON form: nested records as their objects, in lists and dicts too."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def float_text(value: float) -> str:
    """The text that stands for a non-finite float."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return float_text(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    plain = _record(value)
    return str(value) if plain is value else clean(plain)


def fields(record: Any) -> dict[str, Any]:
    """A record's fields in order, by name: its JSON object unless its `to_json()` says
    otherwise (which starts from this)."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _record(value: Any) -> Any:
    """A record's JSON object (its `to_json()`, else its fields in order; nested records are
    met again by the encoder); the value itself when it is no record."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields(value)
    return value


def _default(value: Any) -> Any:
    plain = _record(value)
    return str(value) if plain is value else plain


def dumps(value: Any, **options: Any) -> str:
    """The package's one JSON encoder: json.dumps of the cleaned value (options: indent,
    separators, ...). The C encoder goes first (what is not a JSON value becomes its str(), as
    clean does); the careful pass runs only when it meets a non-finite float or a key JSON has
    no form for."""
    try:
        return json.dumps(value, allow_nan=False, default=_default, **options)
    except (ValueError, TypeError):  # a non-finite float; a key that is not a JSON key
        return json.dumps(clean(value), allow_nan=False, **options)
