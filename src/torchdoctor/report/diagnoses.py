"""Diagnoses in full, for `torchdoctor diagnoses`: what, where, since when, numbers, fixes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torchdoctor._json import dumps
from torchdoctor.diagnose.record import Finding
from torchdoctor.diagnose.story import chains
from torchdoctor.report.alerts import fix_lines

T = TypeVar("T")

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


# Said instead of "no problems found" where no step was recorded: the diagnoses of training
# read steps, so nothing was judged (the end-of-run summary, `diagnoses` of a run or process).
NOTHING_JUDGED = "nothing judged: the training diagnoses need recorded steps"
# Said instead of "no problems found" where a part of torchdoctor failed while it recorded.
INCOMPLETE = "no problems found in what was recorded, which is not all"


def gap(steps: int, failures: Sequence[str]) -> str | None:
    """What is said where nothing was found over a gap (the summary, `diagnoses`, the report):
    no step recorded, or parts of torchdoctor that failed while it recorded; None: a clean
    bill, "no problems found"."""
    if not steps:
        return NOTHING_JUDGED
    if failures:
        return f"{INCOMPLETE}: {len(failures)} part(s) of torchdoctor failed while it recorded"
    return None


def render_full(findings: Sequence[Finding]) -> str:
    """The findings as the story they tell: the latest row of each finding (a later row is its
    state: a rise in severity, a link to its cause, resolved), a chain of one cause in order,
    the findings that no longer hold last."""
    if not findings:
        return "no problems found"
    return "\n\n".join(block(f) for f in as_told(latest(findings), lambda f: f))


def as_told(items: Sequence[T], finding: Callable[[T], Finding]) -> list[T]:
    """`items` (findings, or what holds one: a job's group of ranks) in the story's order: a
    chain of one cause in order, however its findings were found, those that no longer hold
    last."""
    holding = [i for i in items if finding(i).resolved is None]
    resolved = [i for i in items if finding(i).resolved is not None]
    told = chains(holding, lambda i: finding(i).kind, lambda i: finding(i).follows)
    return [i for chain in told for i in chain] + resolved


def latest(findings: Sequence[Finding]) -> list[Finding]:
    """The latest row of each finding (rank, kind, location), in the order found."""
    out: dict[tuple[Any, ...], Finding] = {}  # in the order first found
    for f in sorted(findings, key=lambda f: f.time or 0.0):
        out[(f.rank, f.kind, f.location)] = f
    return list(out.values())


def block(f: Finding) -> str:
    """One finding: its headline, summary, the short evidence, the fixes numbered."""
    where = f" in {f.location}" if f.location else ""
    when = f" at step {f.step}" if f.step is not None else ""
    lines = [f"[{f.severity}] {f.kind}{when}{where}"]
    if f.resolved is not None:
        lines[0] += f"  (resolved: no longer holds from step {f.resolved})"
    if f.follows:
        lines.append(f"  follows {f.follows} (one cause)")
    lines.append(f"  {f.summary}")
    evidence = f.evidence.to_json()
    shown = {k: v for k, v in evidence.items() if k not in _SKIP and v not in (None, [], {})}
    if shown:
        lines.append("  evidence: " + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
    for i, fix in enumerate(f.fix, 1):
        lines.extend(fix_lines(fix, f"  {i}. ", "       "))
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
