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

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def identity(self) -> str:
        return self.key or f"{self.kind}:{self.location or ''}"

    def row(self) -> tuple[Any, ...]:
        """The python.diagnoses row."""
        return (
            self.time,
            self.step,
            self.rank,
            self.kind,
            self.severity,
            self.location,
            self.summary,
            dumps(self.evidence),
            join_fixes(self.fix),
        )
