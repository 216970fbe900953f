"""`detached_loss`: backward() runs on a loss that reaches no parameter of any optimizer: it
was rebuilt from detached values (`.item()`, `.detach()`, `.data`, a new tensor) and made to
require grad again, so the model gets no gradient and never learns.

Seen live (telemetry/silent/loss_graph.py): on two sampled steps, the loss's autograd graph
leads to no parameter that an optimizer holds.
"""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@dataclasses.dataclass(kw_only=True)
class LossLeaf(Record):
    """A tensor the loss's graph starts at: its shape, and whether it is a parameter."""

    shape: list[int]
    parameter: bool


@kind("detached_loss")
@dataclasses.dataclass(kw_only=True)
class DetachedLossEvidence(Evidence):
    step: int
    site: str
    leaf: bool
    leaves: list[LossLeaf]  # where the loss's graph starts
    shape: list[int]  # the loss's


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.detached_loss"):
        evidence = DetachedLossEvidence.from_json(event["data"])
        where = short_site(evidence.site)
        at = f" at {where}" if where else ""
        if evidence.leaf:
            how = (
                "it has no autograd history at all: a tensor made to require grad "
                "(requires_grad_() or torch.tensor(..., requires_grad=True)) after it was "
                "computed from detached values"
            )
        else:
            leaves = evidence.leaves or []
            shapes = ", ".join(str(tuple(leaf.shape or [])) for leaf in leaves) or "none"
            how = (
                "its graph starts at tensors that are not the model's parameters (shapes "
                f"{shapes}): the model's output was detached on the way"
            )
        out.append(
            Diagnosis(
                kind="detached_loss",
                severity="error",
                step=evidence.step,
                location=where,
                summary=(
                    f"The loss backward() runs on{at} reaches none of the optimizers' "
                    f"parameters: {how}. The model gets no gradient and does not learn."
                ),
                evidence=evidence,
                fix=[
                    "compute the loss from the model's output tensor itself: no .item(), "
                    ".detach(), .data, .numpy() or torch.tensor(...) on the way",
                    "remove the requires_grad_() / requires_grad=True added to make "
                    "backward() stop complaining: the error it silenced was the real bug",
                    "check that the forward pass is not under torch.no_grad()",
                ],
                key="detached_loss",
            )
        )
    return out
