"""`no_gradient`: trainable parameters that never receive a gradient (a detach(), a no_grad
block around part of the forward, a branch never used), named by module: from the traced
steps' gradients per module, and, live on sampled steps, an optimizer that steps with no
gradient on any of its parameters (telemetry/silent/update_effect.py: a GAN's generator whose
loss was computed on `fake.detach()`)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

# Its findings describe the run as it stands (every traced step so far):
# one it no longer returns has stopped being true, and the doctor marks it resolved.
RESOLVES = True

MIN_TRACED = 2


@kind("no_gradient")
@dataclasses.dataclass(kw_only=True)
class NoGradientEvidence(Evidence):
    modules: list[str]
    parameters: int
    traced_steps: list[int] | None = optional()  # from the traced steps' gradients
    optimizer: str | None = optional()  # ... or from an optimizer that stepped without any
    step: int | None = optional()
    site: str | None = optional()


FIXES = [
    "look for .detach(), torch.no_grad() or .data in the forward path of these modules",
    "check that their output is used in the loss (a branch computed but never used)",
    "if freezing is intended, set requires_grad_(False) and leave them out of the optimizer",
    "with DistributedDataParallel, unused parameters also need find_unused_parameters=True",
]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return _of_optimizers(inputs) + _of_modules(inputs)


def _of_optimizers(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.no_gradient"):
        d = event["data"]
        modules = list(d.get("modules") or [])
        name = d.get("optimizer", "an optimizer")
        held = f" ({', '.join(modules[:4])})" if modules else ""
        out.append(
            Diagnosis(
                kind="no_gradient",
                severity="error",
                step=d.get("step"),
                location=modules[0] if modules else short_site(d.get("site")),
                summary=(
                    f"{name}.step() runs with no gradient on any of its {d.get('parameters')} "
                    f"trainable parameters{held}, on two sampled steps: backward() never "
                    "reaches them, so their weights never change (a loss computed on a "
                    ".detach()ed output, or outside the graph of these modules)."
                ),
                evidence=NoGradientEvidence.from_json(d),
                fix=[
                    "compute the loss of these modules on outputs that keep their graph: drop "
                    "the .detach() (a GAN's generator loss is netD(fake), not "
                    "netD(fake.detach()))",
                    *FIXES[1:],
                ],
                key=f"no_gradient:{name}",
            )
        )
    return out


def _of_modules(inputs: Inputs) -> list[Diagnosis]:
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
            fix=list(FIXES),
            key="no_gradient",
        )
    ]
