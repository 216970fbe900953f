"""Memory by phase of the last traced step, and the modules whose forward added most.

The same SQL serves a live process, a saved run and the out-of-memory capture; the functions
here turn its rows into data (no rendering).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

PHASES_SQL = """
SELECT step, phase, allocated, max_allocated, reserved
FROM python.memory
WHERE phase = 'setup'
   OR step = (SELECT max(step) FROM python.memory WHERE phase <> 'setup')
ORDER BY time
"""

MODULES_SQL = """
SELECT step, module, type, depth, time, allocated
FROM python.torch_trace
WHERE stage = 'forward'
  AND step = (SELECT max(step) FROM python.torch_trace WHERE stage = 'forward')
ORDER BY time
"""


def records(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def phase_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phase rows with what each added since the one before ("added") and whether it holds
    the step's highest reading ("peak")."""
    out = []
    previous = None
    for row in rows:
        entry = dict(row)
        entry["added"] = None if previous is None else row["allocated"] - previous
        previous = row["allocated"]
        out.append(entry)
    stepped = [r for r in out if r["phase"] != "setup"]
    if stepped:
        top = max(stepped, key=lambda r: (r["allocated"], r["max_allocated"]))
        for r in out:
            r["peak"] = r is top
    return out


def module_deltas(rows: list[dict[str, Any]], limit: int = 10) -> list[dict[str, Any]]:
    """Innermost module calls of one traced forward in call order; each one's "added" is the
    memory after it minus the memory after the call before it. Summed per module, the
    biggest first. (The first call has no call before it and is left out.)"""
    ordered = sorted(rows, key=lambda r: r["time"])
    leaves = []
    for i, row in enumerate(ordered):
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        if nxt is None or nxt["depth"] <= row["depth"]:
            leaves.append(row)
    totals: dict[str, dict[str, Any]] = {}
    for before, row in itertools.pairwise(leaves):
        entry = totals.setdefault(
            row["module"],
            {"module": row["module"], "type": row["type"], "calls": 0, "added": 0},
        )
        entry["calls"] += 1
        entry["added"] += int(row["allocated"]) - int(before["allocated"])
        entry["after"] = int(row["allocated"])
    ranked = sorted(totals.values(), key=lambda e: e["added"], reverse=True)
    return ranked[:limit]


def from_engine(execute: Any) -> dict[str, Any]:
    """Phases and modules through `execute(sql) -> (columns, rows)`."""
    cols, rows = execute(PHASES_SQL)
    phases = phase_rows(records(cols, rows))
    cols, rows = execute(MODULES_SQL)
    mod_records = records(cols, rows)
    return {
        "phases": phases,
        "modules": module_deltas(mod_records),
        "traced_step": mod_records[0]["step"] if mod_records else None,
    }
