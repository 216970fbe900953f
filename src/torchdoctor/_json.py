"""Strict JSON for records and answers: non-finite floats become the strings "nan", "inf",
"-inf" (JSON has no such numbers); a record (a dataclass) becomes the object of its fields in
order, or its own `to_json()` where it has one (a field left out while None); anything else
that is not a JSON value becomes its str()."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any


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
