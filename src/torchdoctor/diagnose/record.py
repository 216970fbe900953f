"""A diagnosis as data: what is wrong, where, since when, the numbers, and what to do."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

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
            json.dumps(clean(self.evidence), allow_nan=False, default=str),
            "\n".join(self.fix),
        )


def clean(value: Any) -> Any:
    """Evidence as strict JSON: non-finite floats become strings ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value
