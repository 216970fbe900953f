"""`frozen_model`: a model frozen all but its normalization layers and biases, the output
layer included: a `requires_grad = False` loop that froze more than it meant to, and a model
that cannot learn its task (a frozen backbone under a trainable head is not this).

Seen live (telemetry/silent/coverage.py), once, at the first sampled update.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis


@kind("frozen_model")
@dataclasses.dataclass(kw_only=True)
class FrozenModelEvidence(Evidence):
    model: str
    trainable: int
    total: int
    trainable_modules: list[str]
    output_layer: str
    output_frozen: bool
    step: int


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.frozen_model"):
        d = event["data"]
        model = d.get("model", "the model")
        trainable, total = d.get("trainable", 0), max(1, d.get("total", 1))
        layer = d.get("output_layer")
        kinds = ", ".join(d.get("trainable_modules") or []) or "biases"
        head = f", its output layer {layer} included" if d.get("output_frozen") else ""
        out.append(
            Diagnosis(
                kind="frozen_model",
                severity="warning",
                step=d.get("step"),
                location=layer or model,
                summary=(
                    f"Only {trainable:,} of {model}'s {total:,} weights ({trainable / total:.2%}) "
                    f"train, all in {kinds}: every weight matrix and kernel is frozen{head}. "
                    "The model can barely learn."
                ),
                evidence=FrozenModelEvidence.from_json(d),
                fix=[
                    f"unfreeze at least the output layer ({layer}): "
                    f"{model}.{layer}.requires_grad_(True)"
                    if layer
                    else "unfreeze the head",
                    "check the loop that sets requires_grad = False: its condition matches "
                    "more parameters than intended",
                    "ignore this if tuning only normalization layers and biases is intended",
                ],
                key=f"frozen_model:{model}",
            )
        )
    return out
