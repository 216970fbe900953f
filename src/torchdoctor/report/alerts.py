"""A diagnosis as the one-paragraph alert printed on stderr when it is found."""

from __future__ import annotations

from torchdoctor.diagnose.record import Diagnosis

_MARK = {"info": "info", "warning": "WARNING", "error": "ERROR"}


def headline(diagnosis: Diagnosis) -> str:
    """`ERROR [oom] at step 2 in encoder.1`: what and where, in one line."""
    where = f" in {diagnosis.location}" if diagnosis.location else ""
    when = f" at step {diagnosis.step}" if diagnosis.step is not None else ""
    return f"{_MARK[diagnosis.severity]} [{diagnosis.kind}]{when}{where}"


def render_alert(diagnosis: Diagnosis, fixes: int = 2) -> str:
    resolved = diagnosis.resolved
    if resolved is not None:  # it no longer holds: said in one line, without fixes
        where = f" in {diagnosis.location}" if diagnosis.location else ""
        when = f" at step {diagnosis.step}" if diagnosis.step is not None else ""
        return (
            f"torchdoctor resolved [{diagnosis.kind}]{where}: it no longer holds from step "
            f"{resolved} (found{when}: {diagnosis.summary})"
        )
    lines = [f"torchdoctor {headline(diagnosis)}"]
    follows = diagnosis.follows
    if follows:
        lines.append(f"  (it follows {follows}: one cause, see that finding first)")
    lines.append(f"  {diagnosis.summary}")
    for fix in diagnosis.fix[:fixes]:
        lines.extend(fix_lines(fix, "  -> ", "       "))
    return "\n".join(lines)


def fix_lines(fix: str, first: str, rest: str) -> list[str]:
    """A fix whole: its first line after `first`, the lines of its code block after `rest`."""
    head, *more = fix.splitlines() or [""]
    return [first + head] + [(rest + line).rstrip() for line in more]
