"""A diagnosis as the one-paragraph alert printed on stderr when it is found."""

from __future__ import annotations

from typing import Any

_MARK = {"info": "info", "warning": "WARNING", "error": "ERROR"}


def render_alert(diagnosis: Any, fixes: int = 2) -> str:
    where = f" in {diagnosis.location}" if diagnosis.location else ""
    when = f" at step {diagnosis.step}" if diagnosis.step is not None else ""
    lines = [f"torchdoctor {_MARK[diagnosis.severity]} [{diagnosis.kind}]{when}{where}"]
    lines.append(f"  {diagnosis.summary}")
    for fix in diagnosis.fix[:fixes]:
        lines.append(f"  -> {fix}")
    return "\n".join(lines)
