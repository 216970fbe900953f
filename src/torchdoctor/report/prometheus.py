"""Metric families in the Prometheus text exposition format (version 0.0.4).

One `# HELP` and one `# TYPE` line per family, then its samples; counters end in `_total`;
label values escaped (backslash, double quote, newline); NaN and infinities as Prometheus
spells them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(families: Iterable[Any]) -> str:
    lines: list[str] = []
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        lines.append(f"# HELP {name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {name} {family.type}")
        for labels, value in family.samples:
            lines.append(f"{name}{_labels(labels)} {number(value)}")
    return "\n".join(lines) + "\n"


def number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape_label(str(value))}"' for key, value in labels.items())
    return "{" + inner + "}"


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
