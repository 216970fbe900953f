"""`exploding_gradients` (not built yet)."""

from __future__ import annotations

from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return []
