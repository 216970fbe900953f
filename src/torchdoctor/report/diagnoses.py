"""Diagnoses in full, for `torchdoctor diagnoses`: what, where, since when, numbers, fixes."""

from __future__ import annotations

import json
from typing import Any

from torchdoctor.diagnose.record import CODE_ELSEWHERE

_SKIP = {
    "threads",
    "causes",
    "history",
    "inputs",
    "bad_gradients",
    "holders",
    "loss_graph",
    "fixes",
}


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
        code = _codes(evidence)
        for i, fix in enumerate(fixes.splitlines() if isinstance(fixes, str) else fixes, 1):
            if fix.endswith(CODE_ELSEWHERE) and fix[: -len(CODE_ELSEWHERE)] in code:
                title = fix[: -len(CODE_ELSEWHERE)]
                lines.append(f"  {i}. {title}:")
                lines += [f"       {line}".rstrip() for line in code[title].splitlines()]
            else:
                lines.append(f"  {i}. {fix}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _codes(evidence: dict[str, Any]) -> dict[str, str]:
    """Fix title -> its code, for the fixes whose code is too long for their line (a crash's
    fixes from the explain catalog)."""
    fixes = evidence.get("fixes")
    if not isinstance(fixes, list):
        return {}
    return {
        f["title"]: f["code"]
        for f in fixes
        if isinstance(f, dict) and isinstance(f.get("title"), str) and f.get("code")
    }


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
