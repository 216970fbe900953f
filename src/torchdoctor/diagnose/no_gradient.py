"""`no_gradient`: trainable parameters that never receive a gradient (a detach(), a no_grad
block around part of the forward, a branch never used), named by module: from the traced
steps' gradients per module, and, live on sampled steps, an optimizer that steps with no
gradient on any of its parameters (telemetry/silent/update_effect.py: a GAN's generator whose
loss was computed on `fake.detach()`). When backward() did bring that optimizer's parameters
gradients and they were gone at its step() (`cleared`), the order of the step is at fault:
step() before backward(), or zero_grad() between them; the per-module finding is then left
out (those modules do get gradients)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

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
    # backward() brought them gradients, cleared before the step read them
    cleared: bool | None = optional()


FIXES = [
    "look for .detach(), torch.no_grad() or .data in the forward path of these modules",
    "check that their output is used in the loss (a branch computed but never used)",
    "if freezing is intended, set requires_grad_(False) and leave them out of the optimizer",
    "with DistributedDataParallel, unused parameters also need find_unused_parameters=True",
]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    optimizers = _of_optimizers(inputs)
    if any(getattr(d.evidence, "cleared", None) for d in optimizers):
        # Their modules do get gradients, cleared before each update: not "never received".
        return optimizers
    return optimizers + _of_modules(inputs)


def _cleared(name: str, d: dict[str, Any], held: str) -> Diagnosis:
    """The optimizer's parameters get gradients from backward(), gone by its step(): the
    step runs before backward() (the gradients of the step before are cleared by zero_grad()
    first), or zero_grad() runs between backward() and step()."""
    where = short_site(d.get("site"))
    at = f" at {where}" if where else ""
    return Diagnosis(
        kind="no_gradient",
        severity="error",
        step=d.get("step"),
        location=where or d.get("optimizer"),
        summary=(
            f"{name}.step(){at} runs with no gradient on any of its {d.get('parameters')} "
            f"trainable parameters{held}, although backward() does bring them gradients: "
            "they are cleared before the step reads them. The step comes before backward() "
            "(zero_grad() clears the last step's gradients, then step() has none), or "
            "zero_grad() runs between backward() and step(). The weights never change."
        ),
        evidence=NoGradientEvidence.from_json(d),
        fix=[
            "order each step as optimizer.zero_grad(), forward, loss.backward(), then "
            "optimizer.step(): the step after backward(), with no zero_grad() in between",
        ],
        key=f"no_gradient:{name}",
    )


def _of_optimizers(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.no_gradient"):
        d = event["data"]
        modules = list(d.get("modules") or [])
        name = d.get("optimizer", "an optimizer")
        held = f" ({', '.join(modules[:4])})" if modules else ""
        if d.get("cleared"):
            out.append(_cleared(name, d, held))
            continue
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
