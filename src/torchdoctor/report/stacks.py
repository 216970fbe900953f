"""python.backtrace rows as readable stacks, one block per thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render_text(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    out: list[str] = []
    current = None
    for r in records:
        if r["thread_id"] != current:
            current = r["thread_id"]
            if out:
                out.append("")
            main = " (main)" if r.get("is_main") else ""
            out.append(f"Thread {r['thread_id']} {r['thread_name']}{main}")
        out.append(f"  {r['func']} ({r['file']}:{r['lineno']})")
        if r.get("code"):
            out.append(f"      {r['code']}")
    return "\n".join(out) if out else "(no threads)"
