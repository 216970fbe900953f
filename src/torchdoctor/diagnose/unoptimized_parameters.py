"""`unoptimized_parameters`: parameters that require grad and get a gradient every step, but
that no optimizer holds: their gradients are computed and never applied (the optimizer was
built before a layer was replaced, or over another copy of the model).

Seen live (telemetry/silent/coverage.py): on two sampled steps, at the update, parameters of
a model with a gradient are in none of the optimizers that have stepped. Parameters frozen on
purpose (`requires_grad=False`) have no gradient and are not this.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis


@kind("unoptimized_parameters")
@dataclasses.dataclass(kw_only=True)
class UnoptimizedParametersEvidence(Evidence):
    model: str
    step: int
    parameters: list[str]
    count: int
    elements: int
    trainable: int
    modules: list[str]
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.unoptimized_parameters"):
        d = event["data"]
        model = d.get("model", "the model")
        count, trainable = d.get("count", 0), d.get("trainable", 0)
        modules = d.get("modules") or []
        shown = ", ".join(modules[:4]) + (" ..." if len(modules) > 4 else "")
        every = count >= trainable > 0
        out.append(
            Diagnosis(
                kind="unoptimized_parameters",
                severity="error" if every else "warning",
                step=d.get("step"),
                location=modules[0] if modules else model,
                summary=(
                    f"{count} of {model}'s {trainable} trainable parameter tensors "
                    f"({d.get('elements', 0):,} weights, in {shown}) get gradients but are in "
                    "no optimizer: they never change."
                    + (
                        " The optimizer holds other tensors than the model trains (built "
                        "over a copy, or before the model was re-created)."
                        if every
                        else " (An optimizer built before these layers were replaced?)"
                    )
                ),
                evidence=UnoptimizedParametersEvidence.from_json(d),
                fix=[
                    "build the optimizer after the model is final (after replacing its head, "
                    "moving or wrapping it), from model.parameters()",
                    "or add them: optimizer.add_param_group({'params': new_layer.parameters()})",
                    "if they are meant to stay fixed, set requires_grad_(False) on them",
                ],
                key=f"unoptimized_parameters:{model}",
            )
        )
    return out
