"""Rows and columns rendered as an aligned text table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from typing import Any

from torchdoctor._json import dumps, float_text

FORMATS = ("table", "json", "csv")
_MAX_CELL = 80


def _cell(value: Any, whole: bool = False) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return float_text(value)
        return f"{value:.3f}" if abs(value) >= 1e5 else f"{value:.6g}"
    text = str(value).replace("\n", "\\n")
    return text if whole or len(text) <= _MAX_CELL else text[: _MAX_CELL - 3] + "..."


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], whole: Sequence[str] = ()) -> str:
    """Columns named in `whole` are never cut (a command line); others at 80 characters."""
    keep = [c in whole for c in columns]
    cells = [[_cell(v, keep[i]) for i, v in enumerate(row)] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        all(
            isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
            for r in rows
            if r[i] is not None
        )
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    noun = "row" if len(rows) == 1 else "rows"
    out.append(f"({len(rows)} {noun})")
    return "\n".join(out)


def to_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    return dumps(records, indent=2)


def to_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return buf.getvalue().rstrip("\n")


RENDERERS: dict[str, Callable[[Sequence[str], Sequence[Sequence[Any]]], str]] = {
    "table": table,
    "json": to_json,
    "csv": to_csv,
}


def render(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str = "table",
    whole: Sequence[str] = (),
) -> str:
    if fmt == "table":
        return table(columns, rows, whole)
    return RENDERERS[fmt](columns, rows)
