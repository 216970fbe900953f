"""What `torchdoctor memory` shows, as data: the census by kind and its largest tensors (live
runs), memory by phase of the last traced step, the modules whose forward added most, the
latest step's reading, and the out-of-memory diagnoses (saved runs)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torchdoctor.memory.phases import MODULES_SQL, PHASES_SQL, module_deltas, phase_rows, records
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


def census(execute: Execute, top: int = 10) -> dict[str, Any]:
    """The census by kind (`bytes` this rank holds, `total` the whole tensors over every rank,
    `world` the ranks sharded tensors span), its largest tensors, and the FSDP2 units (what
    each all-gather materialises), the largest first."""
    cols, rows = execute(CENSUS_SQL.format(top=int(top)))
    recs = records(cols, rows)
    kinds = {r["kind"]: r for r in recs if r["part"] == "kind"}
    by_kind: list[dict[str, Any]] = []
    for kind in KIND_ORDER:
        entry = kinds.get(kind) or {}
        by_kind.append(
            {
                "kind": kind,
                "tensors": int(entry.get("tensors") or 0),
                "bytes": int(entry.get("bytes") or 0),
                "total": int(entry.get("total") or 0),
                "world": int(entry["world"]) if entry.get("world") is not None else None,
            }
        )
    tops = [
        {
            "kind": r["kind"],
            "name": r["name"],
            "shape": r["shape"],
            "dtype": r["dtype"],
            "device": r["device"],
            "bytes": r["bytes"],
            "total_bytes": r["total"],
            "world": r["world"],
            "grad_fn": r["grad_fn"],
        }
        for r in recs
        if r["part"] == "top"
    ]
    units = [
        {
            "unit": r["name"],
            "parameters": int(r["tensors"]),
            "unsharded": int(r["bytes"] or 0),
            "gathered": int(r["total"] or 0),
        }
        for r in recs
        if r["part"] == "unit"
    ]
    units.sort(key=lambda u: u["unsharded"], reverse=True)
    worlds = [e["world"] for e in by_kind if e["world"]]
    return {
        "by_kind": by_kind,
        "total": sum(e["bytes"] for e in by_kind),
        "world": max(worlds) if worlds else None,
        "largest": sorted(tops, key=lambda r: r["bytes"], reverse=True),
        "units": units,
    }


def gather(execute: Execute, live: bool, top: int = 10) -> dict[str, Any]:
    """Everything `torchdoctor memory` prints, through `execute(sql) -> (columns, rows)`."""
    out: dict[str, Any] = {"live": live}
    if live:
        out["census"] = census(execute, top)
    cols, rows = execute(PHASES_SQL)
    out["phases"] = phase_rows(records(cols, rows))
    cols, rows = execute(MODULES_SQL)
    mods = records(cols, rows)
    out["traced_step"] = mods[0]["step"] if mods else None
    out["modules"] = module_deltas(mods)
    cols, rows = execute(LAST_STEP_SQL)
    last = records(cols, rows)
    out["last_step"] = last[0] if last else None
    cols, rows = execute(OOM_SQL)
    ooms = []
    for rec in records(cols, rows):
        try:
            rec["evidence"] = json.loads(rec.get("evidence") or "{}")
        except ValueError:
            rec["evidence"] = {}
        rec["fix"] = split_fixes(rec.get("fix"))
        ooms.append(rec)
    out["oom"] = ooms
    return out
