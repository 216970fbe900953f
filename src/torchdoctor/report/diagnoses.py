"""Diagnoses in full, for `torchdoctor diagnoses`: what, where, since when, numbers, fixes."""

from __future__ import annotations

import json
from typing import Any

from torchdoctor.diagnose.story import chains
from torchdoctor.report.alerts import fix_lines
from torchdoctor.store.schema import split_fixes

_SKIP = {
    "threads",
    "causes",
    "history",
    "inputs",
    "bad_gradients",
    "holders",
    "loss_graph",
    "fixes",
    "job_key",
}


def render_full(records: list[dict[str, Any]]) -> str:
    """The findings as the story they tell: the latest row of each finding (a later row is its
    state: a rise in severity, a link to its cause, resolved), a chain of one cause in order,
    the findings that no longer hold last."""
    if not records:
        return "no problems found"
    found = latest(records)
    holding = [r for r in found if r.get("resolved") is None]
    resolved = [r for r in found if r.get("resolved") is not None]
    ordered = [r for chain in chains(holding, _kind, _follows) for r in chain] + resolved
    return "\n\n".join(_block(r) for r in ordered)


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest row of each finding (rank, kind, location), in the order found."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}  # in the order first found
    for r in sorted(records, key=lambda r: r.get("time") or 0.0):
        out[_key(r)] = r
    return list(out.values())


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r.get("rank"), r.get("kind"), r.get("location"))


def _kind(r: dict[str, Any]) -> Any:
    return r.get("kind")


def _follows(r: dict[str, Any]) -> Any:
    return r.get("follows")


def _block(r: dict[str, Any]) -> str:
    where = f" in {r['location']}" if r.get("location") else ""
    when = f" at step {r['step']}" if r.get("step") is not None else ""
    lines = [f"[{r['severity']}] {r['kind']}{when}{where}"]
    if r.get("resolved") is not None:
        lines[0] += f"  (resolved: no longer holds from step {r['resolved']})"
    if r.get("follows"):
        lines.append(f"  follows {r['follows']} (one cause)")
    lines.append(f"  {r['summary']}")
    evidence = r.get("evidence") or {}
    if isinstance(evidence, str):
        evidence = json.loads(evidence or "{}")
    shown = {k: v for k, v in evidence.items() if k not in _SKIP and v not in (None, [], {})}
    if shown:
        lines.append("  evidence: " + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
    fixes = r.get("fix") or ""
    for i, fix in enumerate(split_fixes(fixes) if isinstance(fixes, str) else fixes, 1):
        lines.extend(fix_lines(fix, f"  {i}. ", "       "))
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
