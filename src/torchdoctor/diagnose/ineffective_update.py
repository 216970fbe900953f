"""`ineffective_update`: optimizer.step() leaves the weights unchanged although they have
gradients and a learning rate large enough to move them visibly: the update is written
somewhere else (a custom step that rebinds a local name instead of updating in place, an
optimizer holding tensors the model does not use), or skipped.

Seen live (telemetry/silent/update_effect.py): on two sampled steps, every weight element
whose expected change exceeds its precision is bit-for-bit the same after step().
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("ineffective_update")
@dataclasses.dataclass(kw_only=True)
class IneffectiveUpdateEvidence(Evidence):
    optimizer: str
    step: int
    site: str
    elements: int
    lr: float
    optimizer_type: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.ineffective_update"):
        d = event["data"]
        name = d.get("optimizer", "the optimizer")
        where = short_site(d.get("site"))
        at = f" at {where}" if where else ""
        out.append(
            Diagnosis(
                kind="ineffective_update",
                severity="error",
                step=d.get("step"),
                location=where,
                summary=(
                    f"{name}.step(){at} leaves the weights unchanged: {d.get('elements')} "
                    f"weights with gradients and lr {d.get('lr')} are bit-for-bit the same "
                    f"after the update, on two sampled steps. {d.get('optimizer_type')}'s "
                    "update does not reach the parameters."
                ),
                evidence=IneffectiveUpdateEvidence.from_json(d),
                fix=[
                    "a custom optimizer must update in place (p.add_(...), p.data.copy_(...) "
                    "under no_grad); `p = p - lr * p.grad` only rebinds a local name",
                    "build the optimizer from the parameters the model uses (after wrapping, "
                    "moving or re-creating the model)",
                ],
                key=f"ineffective_update:{name}",
            )
        )
    return out
