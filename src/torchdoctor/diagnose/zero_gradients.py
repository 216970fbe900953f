"""`zero_gradients`: the gradient norm is exactly 0 on every step recorded (MIN_STEPS or more).
backward() reaches the weights and gives them nothing, so no update moves them. The usual
causes: a loss that does not depend on the model's output (cross_entropy over one class, which
loss_inputs names when it saw it: `single_class`; a term multiplied by 0; a constant), or
activations that are 0 for every input (ReLU units that never fire).

Gradients that are missing (None: a detach, a frozen model) are not zero: no_gradient,
detached_loss and frozen_model say those. A gradient that shrank to nearly nothing is
vanishing_gradients'. Gradients clipped to 0 (a clip threshold of 0) are clip_to_zero's."""

from __future__ import annotations

import dataclasses

import numpy as np

from torchdoctor.diagnose.clip_to_zero import EVENT as CLIP_TO_ZERO
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.series import finite

# Its findings describe the run as it stands: a gradient that later moves resolves it.
RESOLVES = True
MIN_STEPS = 10


@kind("zero_gradients")
@dataclasses.dataclass(kw_only=True)
class ZeroGradientsEvidence(Evidence):
    steps: int
    loss: float | None = optional()  # the loss, where it is the same on every step


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    if inputs.events_of(CLIP_TO_ZERO):
        return []  # the gradients were computed, then clipped to 0: clip_to_zero says so
    steps, norms = finite(inputs, "grad_norm")
    if norms.size < MIN_STEPS or bool(np.any(norms != 0)):
        return []
    _s, losses = finite(inputs, "loss")
    constant = float(losses[0]) if losses.size and bool(np.all(losses == losses[0])) else None
    summary = (
        f"The gradient is exactly 0 on all {norms.size} steps recorded: backward() reaches the "
        "weights but gives them nothing, so no update moves them"
    )
    if constant is not None:
        summary += f". The loss is {constant:.6g} on every step: it does not depend on the output"
    return [
        Diagnosis(
            kind="zero_gradients",
            severity="error",
            step=int(steps[-1]),
            summary=summary + ".",
            evidence=ZeroGradientsEvidence(steps=int(norms.size), loss=constant),
            fix=[
                "check what the loss is computed from: one that does not depend on the model's "
                "output (cross_entropy over a single class, a term multiplied by 0, a constant) "
                "has a zero gradient",
                "if the loss does move, look for activations that are 0 for every input (dead "
                "ReLUs, a clamp) or a torch.where that always picks a constant",
            ],
            key="zero_gradients",
        )
    ]
