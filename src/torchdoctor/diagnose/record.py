"""A diagnosis as data: what is wrong, where, since when, the numbers, and what to do."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, decode, encode
from torchdoctor.store.schema import DIAGNOSES, join_fixes, split_fixes

SEVERITIES = ("info", "warning", "error")


@dataclasses.dataclass
class Diagnosis:
    kind: str  # stable code: nan, divergence, hang, ...
    severity: str  # info, warning or error
    summary: str  # one sentence a person reads first
    location: str | None = None  # module qualified name or file:line
    step: int | None = None
    evidence: Evidence = dataclasses.field(default_factory=Evidence)  # the kind's class
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
        evidence = self.evidence
        if self.job:
            evidence = dataclasses.replace(evidence, job_key=self.identity)
        return (
            self.time,
            self.step,
            self.rank,
            self.kind,
            self.severity,
            self.location,
            self.summary,
            encode(evidence),
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


@dataclasses.dataclass
class Finding:
    """A python.diagnoses row read back (a saved run, a live endpoint, a rank of a job): the
    diagnosis's columns with its evidence decoded by the one codec (diagnose.evidence) and its
    fixes whole; merged over a job's ranks, whether it compares ranks and who reported it."""

    kind: str
    severity: str
    summary: str
    evidence: Evidence
    fix: list[str]
    time: float | None = None
    step: int | None = None
    rank: int | None = None
    location: str | None = None
    resolved: int | None = None
    follows: str | None = None
    job: bool = False  # a job-level finding, shown once for the job (report/cluster.py)
    found_by: list[int] | None = None  # the ranks that reported it (a job's merged finding)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Finding:
        """From a row as a mapping of its columns (evidence as stored, or already parsed)."""
        kind = str(row.get("kind") or "")
        fix = row.get("fix")
        return cls(
            kind=kind,
            severity=str(row.get("severity") or "info"),
            summary=str(row.get("summary") or ""),
            evidence=decode(kind, row.get("evidence")),
            fix=list(fix) if isinstance(fix, (list, tuple)) else split_fixes(fix),
            time=row.get("time"),
            step=row.get("step"),
            rank=row.get("rank"),
            location=row.get("location"),
            resolved=row.get("resolved"),
            follows=row.get("follows"),
        )

    @classmethod
    def of(cls, diagnosis: Diagnosis) -> Finding:
        """A diagnosis as its stored row would read back."""
        return cls.from_row(dict(zip(DIAGNOSES.column_names, diagnosis.row(), strict=True)))

    @property
    def job_key(self) -> str | None:
        return self.evidence.job_key

    def to_json(self) -> dict[str, Any]:
        """The row as JSON output shows it: the columns in order, the evidence an object."""
        out: dict[str, Any] = {
            "time": self.time,
            "step": self.step,
            "rank": self.rank,
            "kind": self.kind,
            "severity": self.severity,
            "location": self.location,
            "summary": self.summary,
            "evidence": self.evidence.to_json(),
            "fix": join_fixes(self.fix),
            "resolved": self.resolved,
            "follows": self.follows,
        }
        if self.job:
            out["job"] = True
            out["found_by"] = list(self.found_by or [])
        return out
