"""`no_gradient`: trainable parameters that never receive a gradient (a detach(), a no_grad
block around part of the forward, a branch never used), named by module."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis

# Its findings describe the run as it stands (every traced step so far):
# one it no longer returns has stopped being true, and the doctor marks it resolved.
RESOLVES = True

MIN_TRACED = 2


@kind("no_gradient")
@dataclasses.dataclass(kw_only=True)
class NoGradientEvidence(Evidence):
    modules: list[str]
    parameters: int
    traced_steps: list[int]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    grads = inputs.module_grads
    if grads.rows == 0:
        return []
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)  # module -> (with_grad, trainable)
    traced: set[int] = set()
    for step, module, with_grad, trainable in zip(
        grads.column("step"),
        grads.column("module"),
        grads.column("with_grad"),
        grads.column("trainable"),
        strict=True,
    ):
        traced.add(int(step))
        seen[module].append((int(with_grad), int(trainable)))
    if len(traced) < MIN_TRACED:
        return []
    never = [
        m
        for m, obs in seen.items()
        if len(obs) == len(traced) and all(w == 0 and t > 0 for w, t in obs)
    ]
    if not never:
        return []
    never.sort()
    count = sum(seen[m][0][1] for m in never)
    shown = ", ".join(never[:4]) + (f" and {len(never) - 4} more" if len(never) > 4 else "")
    return [
        Diagnosis(
            kind="no_gradient",
            severity="warning",
            step=max(traced),
            location=never[0],
            summary=(
                f"{count} trainable parameter tensor(s) never receive a gradient, in {shown} "
                f"(checked on {len(traced)} steps): their weights never change."
            ),
            evidence=NoGradientEvidence(
                modules=never, parameters=count, traced_steps=sorted(traced)
            ),
            fix=[
                "look for .detach(), torch.no_grad() or .data in the forward path of these modules",
                "check that their output is used in the loss (a branch computed but never used)",
                "if freezing is intended, set requires_grad_(False) and leave them out of the "
                "optimizer",
                "with DistributedDataParallel, unused parameters also need "
                "find_unused_parameters=True",
            ],
            key="no_gradient",
        )
    ]
