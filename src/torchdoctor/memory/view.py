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
       count(*) AS tensors, sum(bytes) AS bytes, NULL AS grad_fn
FROM t GROUP BY kind
UNION ALL
SELECT * FROM (
    SELECT 'top', kind, name, shape, dtype, device, 1, bytes, grad_fn
    FROM t WHERE bytes > 0 ORDER BY bytes DESC LIMIT {top}
)
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
    cols, rows = execute(CENSUS_SQL.format(top=int(top)))
    recs = records(cols, rows)
    kinds = {r["kind"]: r for r in recs if r["part"] == "kind"}
    by_kind = []
    for kind in KIND_ORDER:
        entry = kinds.get(kind)
        by_kind.append(
            {
                "kind": kind,
                "tensors": int(entry["tensors"]) if entry else 0,
                "bytes": int(entry["bytes"] or 0) if entry else 0,
            }
        )
    tops = [
        {k: r[k] for k in ("kind", "name", "shape", "dtype", "device", "bytes", "grad_fn")}
        for r in recs
        if r["part"] == "top"
    ]
    return {
        "by_kind": by_kind,
        "total": sum(e["bytes"] for e in by_kind),
        "largest": sorted(tops, key=lambda r: r["bytes"], reverse=True),
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
