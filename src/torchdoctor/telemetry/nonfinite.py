"""The per-step finiteness judgement: a step whose gradient norm or loss is NaN or Inf starts
the NaN localizers (nan_replay.py), before its update when that is still possible; with
--guard the update is dropped (gradient_check.guard_update).

On CUDA the values are read back a step late, after the update: a late non-finite step arms a
synchronous check (`sync_check`) so that the next one is caught before its update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor._failsafe import warn_once
from torchdoctor.telemetry.gradient_check import Check, guard_update

if TYPE_CHECKING:
    from torchdoctor.telemetry.step import StepState

Localizer = Callable[[Any, dict[str, Any]], None]  # (recorder, what was seen)


class NonFinite:
    def __init__(self) -> None:
        self.localizers: list[Localizer] = []
        self.steps = 0  # steps that went non-finite
        self.sync_check = False  # CUDA: read the gradient norm before each update

    def judge(self, rec: Any, state: StepState, check: Check, guard: bool) -> None:
        """Keep the step's gradient norm; a non-finite one (or loss) is reported."""
        state.grad_norm, state.grad_norm_value = check.norm, check.value
        if check.value is None:
            return
        losses = state.step_losses()
        if math.isfinite(check.value) and all_finite(losses):
            return
        info = {"step": rec.step, "grad_norm": check.value, "losses": losses}
        self.seen(rec, state, dict(info, params=check.params))
        if guard and guard_update(check):
            state.skip = True
            rec.event("guard_skip", {"grad_norm": check.value})  # event() cleans it

    def seen(
        self, rec: Any, state: StepState, info: dict[str, Any], once_per_step: bool = True
    ) -> None:
        """A step went non-finite: run the localizers (before the update, when on time)."""
        if once_per_step:
            if state.nonfinite_seen:
                return
            state.nonfinite_seen = True
        self.steps += 1
        for localizer in list(self.localizers):
            try:
                localizer(rec, info)
            except Exception as exc:
                warn_once("nan-callback", f"NaN localization failed: {type(exc).__name__}: {exc}")


def late(rec: Any, step: int, grad_norm: float | None, loss: float | None) -> None:
    """A step's values read back from the GPU after the step: non-finite ones seen late."""
    info = {"step": step, "grad_norm": grad_norm, "losses": [loss], "late": True}
    rec.nonfinite.seen(rec, rec.state, info, once_per_step=False)


def all_finite(values: list[Any]) -> bool:
    """No float among `values` is NaN or Inf (tensors, read back later, are judged then)."""
    isfinite = math.isfinite
    for v in values:  # noqa: SIM110 (a generator costs a frame per call)
        if isinstance(v, float) and not isfinite(v):
            return False
    return True
