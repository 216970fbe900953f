"""Diagnoses in full, for `torchdoctor diagnoses`: what, where, since when, numbers, fixes."""

from __future__ import annotations

import json
from typing import Any

from torchdoctor.report.alerts import fix_lines
from torchdoctor.store.schema import split_fixes

_SKIP = {"threads", "causes", "history", "inputs", "bad_gradients", "holders", "loss_graph"}


def render_full(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no problems found"
    blocks = []
    for r in records:
        where = f" in {r['location']}" if r.get("location") else ""
        when = f" at step {r['step']}" if r.get("step") is not None else ""
        lines = [f"[{r['severity']}] {r['kind']}{when}{where}", f"  {r['summary']}"]
        evidence = r.get("evidence") or {}
        if isinstance(evidence, str):
            evidence = json.loads(evidence or "{}")
        shown = {k: v for k, v in evidence.items() if k not in _SKIP and v not in (None, [], {})}
        if shown:
            lines.append("  evidence: " + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
        fixes = r.get("fix") or ""
        for i, fix in enumerate(split_fixes(fixes) if isinstance(fixes, str) else fixes, 1):
            lines.extend(fix_lines(fix, f"  {i}. ", "       "))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
