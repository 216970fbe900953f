"""Memory by phase of the last traced step, and the modules whose forward added most.

The same SQL serves a live process, a saved run and the out-of-memory capture; the functions
here turn its rows into data (no rendering).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from torchdoctor._json import fields

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


@dataclasses.dataclass(frozen=True)
class PhaseMemory:
    """Memory at the end of one phase of the last traced step (or of setup), what it added
    since the phase before (None for the first) and whether it holds the step's highest
    reading (`peak`: None, and left out of the JSON, when no phase of a step was recorded)."""

    step: int | None
    phase: str
    allocated: int
    max_allocated: int
    reserved: int
    added: int | None
    peak: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.peak is None:
            del out["peak"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PhaseMemory:
        """A phase row as stored (in an out-of-memory diagnosis's evidence)."""
        return cls(
            step=data.get("step"),
            phase=str(data.get("phase")),
            allocated=data.get("allocated") or 0,
            max_allocated=data.get("max_allocated") or 0,
            reserved=data.get("reserved") or 0,
            added=data.get("added"),
            peak=data.get("peak"),
        )


@dataclasses.dataclass(frozen=True)
class ModuleGrowth:
    """What a module's forward calls added to the memory in one traced step, summed."""

    module: str
    type: str
    calls: int
    added: int
    after: int  # the memory after its last call


def records(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def phase_rows(rows: list[dict[str, Any]]) -> list[PhaseMemory]:
    """Phase rows with what each added since the one before and whether it holds the step's
    highest reading."""
    added: list[int | None] = []
    previous = None
    for row in rows:
        added.append(None if previous is None else row["allocated"] - previous)
        previous = row["allocated"]
    stepped = [i for i, r in enumerate(rows) if r["phase"] != "setup"]
    top = (
        max(stepped, key=lambda i: (rows[i]["allocated"], rows[i]["max_allocated"]))
        if stepped
        else None
    )
    return [
        PhaseMemory(
            step=row["step"],
            phase=row["phase"],
            allocated=row["allocated"],
            max_allocated=row["max_allocated"],
            reserved=row["reserved"],
            added=added[i],
            peak=None if top is None else i == top,
        )
        for i, row in enumerate(rows)
    ]


def module_deltas(rows: list[dict[str, Any]], limit: int = 10) -> list[ModuleGrowth]:
    """Innermost module calls of one traced forward in call order; each one's "added" is the
    memory after it minus the memory after the call before it. Summed per module, the
    biggest first. (The first call has no call before it and is left out.)"""
    ordered = sorted(rows, key=lambda r: r["time"])
    leaves = []
    for i, row in enumerate(ordered):
        nxt = ordered[i + 1] if i + 1 < len(ordered) else None
        if nxt is None or nxt["depth"] <= row["depth"]:
            leaves.append(row)
    totals: dict[str, ModuleGrowth] = {}
    for before, row in itertools.pairwise(leaves):
        entry = totals.get(row["module"]) or ModuleGrowth(row["module"], row["type"], 0, 0, 0)
        totals[row["module"]] = dataclasses.replace(
            entry,
            calls=entry.calls + 1,
            added=entry.added + int(row["allocated"]) - int(before["allocated"]),
            after=int(row["allocated"]),
        )
    ranked = sorted(totals.values(), key=lambda e: e.added, reverse=True)
    return ranked[:limit]


def from_engine(execute: Any) -> dict[str, Any]:
    """Phases and modules through `execute(sql) -> (columns, rows)`."""
    cols, rows = execute(PHASES_SQL)
    phases = phase_rows(records(cols, rows))
    cols, rows = execute(MODULES_SQL)
    mod_records = records(cols, rows)
    return {  # the out-of-memory evidence's stored form
        "phases": [p.to_json() for p in phases],
        "modules": [dataclasses.asdict(m) for m in module_deltas(mod_records)],
        "traced_step": mod_records[0]["step"] if mod_records else None,
    }
