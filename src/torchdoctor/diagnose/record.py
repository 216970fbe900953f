"""A diagnosis as data: what is wrong, where, since when, the numbers, and what to do."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from torchdoctor._json import dumps
from torchdoctor.store.schema import join_fixes

SEVERITIES = ("info", "warning", "error")


@dataclasses.dataclass
class Diagnosis:
    kind: str  # stable code: nan, divergence, hang, ...
    severity: str  # info, warning or error
    summary: str  # one sentence a person reads first
    location: str | None = None  # module qualified name or file:line
    step: int | None = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    fix: list[str] = dataclasses.field(default_factory=list)  # ranked remedies
    rank: int = 0
    time: float = dataclasses.field(default_factory=time.time)
    key: str | None = None  # what makes two findings the same one (default: kind + location)
    job: bool = False  # compares ranks: `rank` is the rank it is about, not the one reporting
    resolved: int | None = None  # the step from which it no longer held (None: it holds)
    follows: str | None = None  # the kind of the earlier finding it follows from (story.py)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def identity(self) -> str:
        return self.key or f"{self.kind}:{self.location or ''}"

    def row(self) -> tuple[Any, ...]:
        """The python.diagnoses row. A job-level finding carries its identity in its evidence
        (`job_key`), so that the same finding reported by many ranks, or again later, is shown
        once."""
        evidence = dict(self.evidence, job_key=self.identity) if self.job else self.evidence
        return (
            self.time,
            self.step,
            self.rank,
            self.kind,
            self.severity,
            self.location,
            self.summary,
            dumps(evidence),
            join_fixes(self.fix),
            self.resolved,
            self.follows,
        )


def fix_with_code(title: str, code: str) -> str:
    """A remedy and its code. One line of code (the comment lines around it being context) goes
    on the title's line; a block follows whole on the lines after it (the `fix` column keeps
    them: store/schema.py join_fixes), never cut after its header (`with torch.no_grad():`
    alone says nothing)."""
    lines = [x.rstrip() for x in code.splitlines() if x.strip()]
    statements = [x for x in lines if not x.lstrip().startswith("#")]
    if not statements:
        return title
    if len(statements) == 1:
        return f"{title}: {statements[0].strip()}"
    return f"{title}:\n" + "\n".join(lines)
