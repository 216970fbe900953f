"""`vanishing_gradients`: gradients collapsing towards zero, in total or in some modules while
the rest of the model still gets them."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.series import finite

# Its findings describe the run as it stands (the recent gradients):
# one it no longer returns has stopped being true, and the doctor marks it resolved.
RESOLVES = True

COLLAPSE = 1e-4  # total norm below this fraction of its early level
RELATIVE = 1e-5  # a module's grad/weight ratio below this fraction of the model's median
MIN_TRACED = 2


@kind("vanishing_gradients")
@dataclasses.dataclass(kw_only=True)
class VanishingGradientsEvidence(Evidence):
    # the total gradient norm shrank (early against now) ...
    early_grad_norm: float | None = optional()
    grad_norm: float | None = optional()
    # ... or the first modules' gradients are a vanishing share of the last ones'
    modules: list[str] | None = optional()
    relative_grad: dict[str, float] | None = optional()  # module -> its largest share of the last
    traced_steps: list[int] | None = optional()


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return _modules(inputs) or _total(inputs)


def _total(inputs: Inputs) -> list[Diagnosis]:
    steps, norms = finite(inputs, "grad_norm")
    if norms.size < 30:
        return []
    early = float(np.median(norms[2:12]))
    late = float(np.median(norms[-10:]))
    if early <= 0 or late > COLLAPSE * early:
        return []
    return [
        Diagnosis(
            kind="vanishing_gradients",
            severity="warning",
            step=int(steps[-1]),
            summary=(
                f"Gradients have vanished: total norm {late:.3g} against {early:.3g} early on "
                f"({early / max(late, 1e-30):.0f}x smaller); the weights have stopped moving."
            ),
            evidence=VanishingGradientsEvidence(early_grad_norm=early, grad_norm=late),
            fix=_FIXES,
            key="vanishing_gradients",
        )
    ]


def _modules(inputs: Inputs) -> list[Diagnosis]:
    grads = inputs.module_grads
    if grads.rows == 0:
        return []
    per_step: dict[int, dict[str, float]] = defaultdict(dict)
    for step, module, g, p in zip(
        grads.column("step"),
        grads.column("module"),
        grads.column("grad_norm"),
        grads.column("param_norm"),
        strict=True,
    ):
        if g is not None and p:
            per_step[int(step)][module] = g / p
    if len(per_step) < MIN_TRACED:
        return []
    starving: dict[str, list[float]] = defaultdict(list)
    for ratios in per_step.values():
        if len(ratios) < 3:
            return []
        median = float(np.median(list(ratios.values())))
        for module, ratio in ratios.items():
            if median > 0 and ratio < RELATIVE * median:
                starving[module].append(ratio / median)
    stuck = [m for m, hits in starving.items() if len(hits) == len(per_step)]
    if not stuck:
        return []
    evidence = VanishingGradientsEvidence(
        modules=stuck,
        relative_grad={m: max(starving[m]) for m in stuck},
        traced_steps=sorted(per_step),
    )
    return [
        Diagnosis(
            kind="vanishing_gradients",
            severity="warning",
            step=max(per_step),
            location=stuck[0],
            summary=(
                f"Gradients vanish in {', '.join(stuck[:3])}"
                f"{' and others' if len(stuck) > 3 else ''}: their gradient, relative to their "
                f"weights, is under {RELATIVE:g} of the rest of the model's on every traced step."
            ),
            evidence=evidence,
            fix=_FIXES,
            key="vanishing_gradients",
        )
    ]


_FIXES = [
    "use activations that keep gradients alive (ReLU/GELU instead of sigmoid/tanh in deep stacks)",
    "add normalisation (LayerNorm/BatchNorm) and residual connections around deep blocks",
    "check the initialisation (kaiming/xavier) and that the learning rate is not tiny",
    "under float16 without GradScaler small gradients underflow to zero: use GradScaler or bf16",
]
