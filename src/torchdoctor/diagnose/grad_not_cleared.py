"""`grad_not_cleared`: an optimizer's gradients are never cleared between two of its updates
(optimizer.zero_grad() missing), so each update applies every earlier gradient again.

Told apart from gradient accumulation in the live process (telemetry/silent/grad_reset.py):
the gradients at an update equal, up to one common factor, the gradients left after the
previous update plus everything backward() brought in since. Accumulation clears them after
each update, so its gradients are what came in since, alone. When clipping scales huge new
gradients down to a norm of 1, the old ones vanish in that sum and both readings match: then
the gradients the update applied, found unchanged when the next backward() began and never
cleared before this update, decide.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("grad_not_cleared")
@dataclasses.dataclass(kw_only=True)
class GradNotClearedEvidence(Evidence):
    optimizer: str
    step: int
    previous_step: int
    site: str
    micro_batches: int
    fetches: int
    residual_kept: float
    residual_cleared: float
    residual_last: float
    previous_share: float
    # the next backward() began with the gradients the update applied, and nothing cleared
    # them before this one: said where clipping made both readings match
    untouched: bool | None = optional()


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.grad_not_cleared"):
        d = event["data"]
        name = d.get("optimizer", "the optimizer")
        where = short_site(d.get("site"))
        at = f" (its step() at {where})" if where else ""
        how = (
            "they were still there, unchanged, when the next backward() began"
            if d.get("untouched")
            else f"matched to a residual of {d.get('residual_kept', 0):.0e}"
        )
        out.append(
            Diagnosis(
                kind="grad_not_cleared",
                severity="error",
                step=d.get("step"),
                location=where,
                summary=(
                    f"Gradients are never cleared between updates of {name}{at}: the gradients "
                    f"applied at step {d.get('step')} are those of step "
                    f"{d.get('previous_step')} plus the new ones ({how}), so every update "
                    "applies all earlier gradients again. optimizer.zero_grad() is missing."
                ),
                evidence=GradNotClearedEvidence.from_json(d),
                fix=[
                    "call optimizer.zero_grad() once per update: before the forward pass, or "
                    "right after optimizer.step()",
                    "when accumulating gradients on purpose, clear them after each "
                    "optimizer.step() (every N micro-batches), never not at all",
                    "the loss may look flat or noisy meanwhile: no learning-rate change fixes this",
                ],
                key=f"grad_not_cleared:{name}",
            )
        )
    return out
