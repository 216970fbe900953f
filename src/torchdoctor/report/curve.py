"""A series as a small chart for the terminal (plain ASCII): one column per step or per group of
steps, a log scale when the values are positive and span more than 20x."""

from __future__ import annotations

import math
from typing import Any

WIDTH = 60
HEIGHT = 8


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan if isinstance(value, str) else None
    return out


def render_curve(values: list[Any], label: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    points = [_number(v) for v in values]
    finite = [v for v in points if v is not None and math.isfinite(v)]
    if not finite:
        return f"{label}: no finite values"
    log = min(finite) > 0 and max(finite) / min(finite) > 20
    scale = (lambda v: math.log10(v)) if log else (lambda v: v)
    n = len(points)
    columns = min(width, n)
    cells: list[float | None] = []
    for c in range(columns):
        start, end = c * n // columns, max(c * n // columns + 1, (c + 1) * n // columns)
        group = [v for v in points[start:end] if v is not None]
        if not group:
            cells.append(None)
        elif any(not math.isfinite(v) for v in group):
            cells.append(math.nan)
        else:
            cells.append(sum(group) / len(group))
    lo, hi = scale(min(finite)), scale(max(finite))
    span = hi - lo or 1.0
    grid = [[" "] * columns for _ in range(height)]
    for c, value in enumerate(cells):
        if value is None:
            continue
        if not math.isfinite(value):
            grid[0][c] = "!"
            continue
        row = round((scale(value) - lo) / span * (height - 1))
        grid[height - 1 - row][c] = "*"
    top, bottom = f"{max(finite):.3g}", f"{min(finite):.3g}"
    pad = max(len(top), len(bottom))
    lines = [f"{label}" + (" (log scale)" if log else "")]
    for r, row in enumerate(grid):
        axis = top if r == 0 else bottom if r == height - 1 else ""
        lines.append(f"  {axis.rjust(pad)} |{''.join(row)}".rstrip())
    lines.append(f"  {' ' * pad} +{'-' * columns}")
    last = str(n - 1)
    lines.append(f"  {' ' * pad}  0{last.rjust(columns - 1)}" + "  (step)")
    return "\n".join(lines)
