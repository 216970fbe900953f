"""Where a run's step time went, as the summary and the report show it: python.steps's phase
columns (data, forward, evaluation, backward, optimizer, other), and `compile`, the time
torch.compile spent compiling (python.compile's durations, by step).

Compiling happens inside a phase (the first call of a compiled model is in the forward,
AOTAutograd's backward graph is compiled at the first backward), so its time is taken out of
the forward first, then the backward, the evaluation and the rest of the step, never below
zero: the bands still add up to the step's duration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from torchdoctor.store.schema import STEP_PHASES

SHOWN = ("data_wait", "forward", "evaluation", "compile", "backward", "optimizer", "other")
LABELS = {
    "data_wait": "data",
    "forward": "forward",
    "evaluation": "evaluation",
    "compile": "compile",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
}
OPTIONAL = ("evaluation", "compile")  # said only when the run has some
_COMPILED_IN = ("forward", "backward", "evaluation", "other")


def split(phases: Mapping[str, Any], compile_seconds: Any) -> dict[str, Any]:
    """`phases` (python.steps's phase columns: totals, or arrays of one value per step) with
    the compile time taken out of the phases it happened in, in SHOWN order. A phase a run
    saved before it existed (NULL, NaN) counts as zero."""
    out: dict[str, Any] = {p: _zeroed(phases.get(p), compile_seconds) for p in STEP_PHASES}
    left = _zeroed(compile_seconds, compile_seconds)
    taken = left * 0.0
    for phase in _COMPILED_IN:
        take = np.minimum(left, out[phase])
        out[phase] = out[phase] - take
        taken = taken + take
        left = left - take
    out["compile"] = taken
    return {p: out[p] if isinstance(out[p], np.ndarray) else float(out[p]) for p in SHOWN}


def _zeroed(value: Any, like: Any) -> Any:
    if value is None:
        return np.zeros_like(like, dtype=float) if isinstance(like, np.ndarray) else 0.0
    if isinstance(value, np.ndarray):
        return np.nan_to_num(value.astype(float), nan=0.0)
    value = float(value)
    return 0.0 if value != value else value


def shown(phases: Mapping[str, float]) -> list[str]:
    """The phases a text names: every one, but evaluation and compile only where they took
    time."""
    return [p for p in SHOWN if p not in OPTIONAL or phases.get(p)]
