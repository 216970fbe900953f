"""`exploding_gradients`: the total gradient norm far above its own recent range, and the
module (on traced steps) whose gradient grew most."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.series import finite

HISTORY = 10  # steps of normal behaviour needed before judging
SUSTAINED = 3  # consecutive steps above FACTOR
FACTOR = 10.0
SPIKE = 1000.0  # a single step this far above is enough


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    steps, norms = finite(inputs, "grad_norm")
    if norms.size < HISTORY + SUSTAINED:
        return []
    base = float(np.median(norms[:-SUSTAINED][-50:]))
    if base <= 0:
        return []
    recent = norms[-SUSTAINED:]
    ratio = float(recent.min()) / base
    spike = float(norms[-1]) / base
    if ratio < FACTOR and spike < SPIKE:
        return []
    module, growth = _worst_module(inputs)
    evidence: dict[str, Any] = {
        "grad_norm": float(norms[-1]),
        "typical_grad_norm": base,
        "factor": max(ratio, spike),
        "steps": [int(s) for s in steps[-SUSTAINED:]],
    }
    if module is not None:
        evidence["module_growth"] = growth
    where = f"; the largest growth is in {module} ({growth:.3g}x)" if module else ""
    severity = "error" if max(ratio, spike) >= SPIKE else "warning"
    return [
        Diagnosis(
            kind="exploding_gradients",
            severity=severity,
            step=int(steps[-1]),
            location=module,
            summary=(
                f"Gradients are exploding: total norm {norms[-1]:.4g}, {max(ratio, spike):.3g}x "
                f"its usual {base:.4g}{where}."
            ),
            evidence=evidence,
            fix=[
                "clip the gradient norm: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
                "lower the learning rate or lengthen the warm-up",
                "check for a missing normalisation (LayerNorm/BatchNorm) or a residual without "
                "scaling in the module named",
                "under float16, use torch.amp.GradScaler (it skips steps with Inf gradients)",
            ],
            key="exploding_gradients",
        )
    ]


def _worst_module(inputs: Inputs) -> tuple[str | None, float]:
    """The module whose gradient norm grew most between its first and last traced step."""
    grads = inputs.module_grads
    if grads.rows == 0:
        return None, 0.0
    steps = grads.data["step"]
    if len(set(steps.tolist())) < 2:
        return None, 0.0
    first, last = int(steps.min()), int(steps.max())
    norms = grads.column("grad_norm")
    names = grads.column("module")
    before = {n: v for n, v, s in zip(names, norms, steps, strict=True) if s == first and v}
    after = {n: v for n, v, s in zip(names, norms, steps, strict=True) if s == last and v}
    best, growth = None, 0.0
    for name, value in after.items():
        old = before.get(name)
        if old and math.isfinite(value) and value / old > growth:
            best, growth = name, value / old
    return (best, growth) if growth >= FACTOR else (None, growth)
