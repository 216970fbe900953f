"""The end-of-run numbers of a recorded run (what `torchdoctor run` prints on stderr when the
script ends): steps, time by phase, what was found, where the run is saved."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchdoctor.diagnose.record import Diagnosis


@dataclasses.dataclass(frozen=True)
class RunSummary:
    steps: int
    run_dir: str
    duration: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds by phase
    skipped: int = 0  # updates skipped for non-finite gradients
    last_loss: float | None = None
    diagnoses: Sequence[Diagnosis] = ()
    exit_code: int | None = None
    crashed: bool = False
    printed: frozenset[str] = frozenset()  # identities of the findings already printed in full
