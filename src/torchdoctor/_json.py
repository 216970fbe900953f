"""Strict JSON for records and answers: non-finite floats become the strings "nan", "inf",
"-inf" (JSON has no such numbers), anything that is not a JSON value becomes its str()."""

from __future__ import annotations

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
    return str(value)


def dumps(value: Any, **options: Any) -> str:
    """The package's one JSON encoder: json.dumps of the cleaned value (options: indent,
    separators, ...). The C encoder goes first (what is not a JSON value becomes its str(), as
    clean does); the careful pass runs only when it meets a non-finite float or a key JSON has
    no form for."""
    try:
        return json.dumps(value, allow_nan=False, default=str, **options)
    except (ValueError, TypeError):  # a non-finite float; a key that is not a JSON key
        return json.dumps(clean(value), allow_nan=False, **options)
