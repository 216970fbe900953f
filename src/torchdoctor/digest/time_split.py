"""Where a run's step time went, as the summary and the report show it: python.steps's phase
columns (data, forward, evaluation, backward, optimizer, other), and `compile`, the time
torch.compile spent compiling (python.compile's durations, by step).

Compiling happens inside a step's phases (a recompilation in the forward, AOTAutograd's
backward graph at the first backward) or before the first event the step recorded (the first
call of a compiled model, whose forward the probe does not see): a step's compile time is
taken out of its forward, then backward, evaluation and other time, as far as they hold it,
and the rest is time before the step, added to its duration. The bands add up to the
durations so extended.
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


def split(
    phases: Mapping[str, Any], duration: Any, compile_seconds: Any
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per step: the bands (SHOWN order) and the durations, from python.steps's phase columns
    and `duration` (arrays, NULL or NaN read as zero: a column a run saved before it existed)
    and the compile seconds of each step."""
    compiled = _zeroed(compile_seconds)
    out = {p: _zeroed(phases.get(p), len(compiled)) for p in STEP_PHASES}
    left = compiled.copy()
    for phase in _COMPILED_IN:
        take = np.minimum(left, out[phase])
        out[phase] = out[phase] - take
        left = left - take
    out["compile"] = compiled
    return {p: out[p] for p in SHOWN}, _zeroed(duration, len(compiled)) + left


def totals(bands: Mapping[str, np.ndarray]) -> dict[str, float]:
    return {p: float(np.sum(v)) for p, v in bands.items()}


def by_step(steps: np.ndarray, step_of: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Compile `seconds` (at the steps `step_of`, NULL read as before the first) summed along
    `steps`; compiling before the first step shown counts in it."""
    out = np.zeros(len(steps), dtype=float)
    if not len(steps) or not len(seconds):
        return out
    order = np.argsort(steps, kind="stable")
    where = np.searchsorted(steps[order], step_of)
    where = np.clip(where, 0, len(steps) - 1)
    found = steps[order][where] == step_of
    first = step_of < steps[order][0]
    keep = (found | first) & np.isfinite(seconds)
    np.add.at(out, order[np.where(first, 0, where)][keep], seconds[keep])
    return out


def _zeroed(value: Any, n: int | None = None) -> np.ndarray:
    if value is None:
        return np.zeros(n or 0, dtype=float)
    arr = np.nan_to_num(np.asarray(value, dtype=float), nan=0.0)
    return arr if arr.ndim else np.full(n or 1, float(arr))


def shown(phases: Mapping[str, float]) -> list[str]:
    """The phases a text names: every one, but evaluation and compile only where they took
    time."""
    return [p for p in SHOWN if p not in OPTIONAL or phases.get(p)]
