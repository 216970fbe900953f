"""What `torchdoctor memory` shows, as data: the census by kind and its largest tensors (live
runs), memory by phase of the last traced step, the modules whose forward added most, the
latest step's reading, and the out-of-memory diagnoses (saved runs)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from torchdoctor._json import fields
from torchdoctor.memory.phases import (
    MODULES_SQL,
    PHASES_SQL,
    ModuleGrowth,
    PhaseMemory,
    module_deltas,
    phase_rows,
    records,
)
from torchdoctor.store.schema import split_fixes

Execute = Callable[[str], tuple[list[str], list[Any]]]

CENSUS_SQL = """
WITH t AS (SELECT * FROM python.tensors)
SELECT 'kind' AS part, kind, NULL AS name, NULL AS shape, NULL AS dtype, NULL AS device,
       count(*) AS tensors, sum(bytes) AS bytes,
       -- the whole over all ranks; an all-gathered copy is counted by its shard's DTensor
       sum(CASE WHEN unit IS NOT NULL AND world IS NULL THEN 0
                ELSE coalesce(total_bytes, bytes) END) AS total,
       max(world) AS world, NULL AS grad_fn
FROM t GROUP BY kind
UNION ALL
SELECT * FROM (
    SELECT 'top', kind, name, shape, dtype, device, 1, bytes, total_bytes, world, grad_fn
    FROM t WHERE bytes > 0 ORDER BY bytes DESC LIMIT {top}
)
UNION ALL
SELECT 'unit', 'parameter', unit, NULL, NULL, NULL, count(*), sum(total_bytes),
       sum(CASE WHEN world IS NULL THEN total_bytes ELSE 0 END), max(world), NULL
FROM t WHERE kind = 'parameter' AND unit IS NOT NULL GROUP BY unit
"""

LAST_STEP_SQL = """
SELECT step, allocated, max_allocated, reserved, rss
FROM python.steps ORDER BY step DESC LIMIT 1
"""

OOM_SQL = """
SELECT time, step, rank, location, summary, evidence, fix
FROM python.diagnoses WHERE kind = 'oom' ORDER BY time
"""

KIND_ORDER = ("parameter", "gradient", "optimizer_state", "buffer", "activation", "other")


@dataclasses.dataclass(frozen=True)
class KindCount:
    """The live tensors of one kind: `bytes` this rank holds, `total` the whole tensors over
    every rank, `world` the ranks sharded tensors span."""

    kind: str
    tensors: int
    bytes: int
    total: int
    world: int | None


@dataclasses.dataclass(frozen=True)
class LargeTensor:
    kind: str
    name: str | None
    shape: str
    dtype: str
    device: str
    bytes: int
    total_bytes: int | None
    world: int | None
    grad_fn: str | None


@dataclasses.dataclass(frozen=True)
class ShardUnit:
    """An FSDP2 unit: what its all-gather materialises (`unsharded`), and `gathered`, what
    of it is held whole now."""

    unit: str
    parameters: int
    unsharded: int
    gathered: int


@dataclasses.dataclass(frozen=True)
class Census:
    by_kind: list[KindCount]
    total: int
    world: int | None
    largest: list[LargeTensor]
    units: list[ShardUnit]  # the largest first


@dataclasses.dataclass(frozen=True)
class LastStep:
    step: int
    allocated: int | None
    max_allocated: int | None
    reserved: int | None
    rss: int | None


@dataclasses.dataclass(frozen=True)
class OomRecord:
    """An `oom` row of python.diagnoses: its evidence as stored (parsed JSON; the codec,
    diagnose.evidence.decode, reads it), its fixes one a line."""

    time: float
    step: int | None
    rank: int | None
    location: str | None
    summary: str
    evidence: dict[str, object]
    fix: list[str]


@dataclasses.dataclass(frozen=True)
class MemoryView:
    """What `torchdoctor memory` shows (its JSON: the census only for a live run)."""

    live: bool
    census: Census | None
    phases: list[PhaseMemory]
    traced_step: int | None
    modules: list[ModuleGrowth]
    last_step: LastStep | None
    oom: list[OomRecord]

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.census is None:
            del out["census"]
        return out


def census(execute: Execute, top: int = 10) -> Census:
    """The census by kind, its largest tensors, and the FSDP2 units (what each all-gather
    materialises), the largest first."""
    cols, rows = execute(CENSUS_SQL.format(top=int(top)))
    recs = records(cols, rows)
    kinds = {r["kind"]: r for r in recs if r["part"] == "kind"}
    by_kind: list[KindCount] = []
    for kind in KIND_ORDER:
        entry = kinds.get(kind) or {}
        by_kind.append(
            KindCount(
                kind=kind,
                tensors=int(entry.get("tensors") or 0),
                bytes=int(entry.get("bytes") or 0),
                total=int(entry.get("total") or 0),
                world=int(entry["world"]) if entry.get("world") is not None else None,
            )
        )
    tops = [
        LargeTensor(
            kind=r["kind"],
            name=r["name"],
            shape=r["shape"],
            dtype=r["dtype"],
            device=r["device"],
            bytes=r["bytes"],
            total_bytes=r["total"],
            world=r["world"],
            grad_fn=r["grad_fn"],
        )
        for r in recs
        if r["part"] == "top"
    ]
    units = [
        ShardUnit(
            unit=r["name"],
            parameters=int(r["tensors"]),
            unsharded=int(r["bytes"] or 0),
            gathered=int(r["total"] or 0),
        )
        for r in recs
        if r["part"] == "unit"
    ]
    units.sort(key=lambda u: u.unsharded, reverse=True)
    worlds = [e.world for e in by_kind if e.world]
    return Census(
        by_kind=by_kind,
        total=sum(e.bytes for e in by_kind),
        world=max(worlds) if worlds else None,
        largest=sorted(tops, key=lambda r: r.bytes, reverse=True),
        units=units,
    )


def gather(execute: Execute, live: bool, top: int = 10) -> MemoryView:
    """Everything `torchdoctor memory` prints, through `execute(sql) -> (columns, rows)`."""
    counted = census(execute, top) if live else None
    cols, rows = execute(PHASES_SQL)
    phases = phase_rows(records(cols, rows))
    cols, rows = execute(MODULES_SQL)
    mods = records(cols, rows)
    cols, rows = execute(LAST_STEP_SQL)
    last = records(cols, rows)
    cols, rows = execute(OOM_SQL)
    ooms = []
    for rec in records(cols, rows):
        try:
            evidence = json.loads(rec.get("evidence") or "{}")
        except ValueError:
            evidence = {}
        ooms.append(
            OomRecord(
                time=rec["time"],
                step=rec["step"],
                rank=rec["rank"],
                location=rec["location"],
                summary=rec["summary"],
                evidence=evidence,
                fix=split_fixes(rec.get("fix")),
            )
        )
    return MemoryView(
        live=live,
        census=counted,
        phases=phases,
        traced_step=mods[0]["step"] if mods else None,
        modules=module_deltas(mods),
        last_step=LastStep(**last[0]) if last else None,
        oom=ooms,
    )
