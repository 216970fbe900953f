"""A diagnosis as the one-paragraph alert printed on stderr when it is found."""

from __future__ import annotations

from typing import Any

_MARK = {"info": "info", "warning": "WARNING", "error": "ERROR"}


def render_alert(diagnosis: Any, fixes: int = 2) -> str:
    where = f" in {diagnosis.location}" if diagnosis.location else ""
    when = f" at step {diagnosis.step}" if diagnosis.step is not None else ""
    resolved = getattr(diagnosis, "resolved", None)
    if resolved is not None:  # it no longer holds: said in one line, without fixes
        return (
            f"torchdoctor resolved [{diagnosis.kind}]{where}: it no longer holds from step "
            f"{resolved} (found{when}: {diagnosis.summary})"
        )
    lines = [f"torchdoctor {_MARK[diagnosis.severity]} [{diagnosis.kind}]{when}{where}"]
    follows = getattr(diagnosis, "follows", None)
    if follows:
        lines.append(f"  (it follows {follows}: one cause, see that finding first)")
    lines.append(f"  {diagnosis.summary}")
    for fix in diagnosis.fix[:fixes]:
        lines.append(f"  -> {fix}")
    return "\n".join(lines)
