"""Strict JSON for records: non-finite floats become the strings "nan", "inf", "-inf"."""

from __future__ import annotations

import json
import math
from typing import Any


def clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(clean(value), allow_nan=False, default=str)
