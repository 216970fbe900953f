"""`divergence`: the loss climbing by orders of magnitude over recent steps, caught before it
overflows (then it is a `nan`)."""

from __future__ import annotations

import numpy as np

from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.series import finite, smooth

MIN_STEPS = 10
WARNING_FACTOR = 100.0  # two orders of magnitude above the best smoothed loss
ERROR_FACTOR = 1e4


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    steps, loss = finite(inputs, "loss")
    if loss.size < MIN_STEPS or (loss <= 0).any():
        return []  # ratios mean nothing for losses that reach zero or below
    smoothed = smooth(loss, 3)
    valid = ~np.isnan(smoothed)
    if valid.sum() < MIN_STEPS - 2:
        return []
    best_i = int(np.nanargmin(smoothed))
    best = float(smoothed[best_i])
    now = float(np.median(loss[-3:]))
    factor = now / best
    rising = now > float(np.median(loss[-8:-3])) if loss.size >= 8 else True
    if factor < WARNING_FACTOR or not rising or best_i >= loss.size - 3:
        return []
    _steps_lr, lr = finite(inputs, "lr")
    lr_now = float(lr[-1]) if lr.size else None
    warmup = bool(lr.size >= 3 and lr[: max(3, lr.size // 4)].max() > lr[0] * 1.01)
    _s, norms = finite(inputs, "grad_norm")
    first_step = int(steps[best_i])
    since = int(steps[-1]) - first_step
    evidence = {
        "best_loss": best,
        "best_step": first_step,
        "loss": now,
        "factor": factor,
        "steps_since_best": since,
        "lr": lr_now,
        "warmup": warmup,
        "grad_norm_at_best": float(norms[min(best_i, norms.size - 1)]) if norms.size else None,
        "grad_norm_now": float(norms[-1]) if norms.size else None,
    }
    fixes = [
        f"lower the learning rate (now {lr_now:g}); a tenth is a good first try"
        if lr_now
        else "lower the learning rate",
        "add gradient clipping: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    ]
    if not warmup:
        fixes.insert(1, "add a learning-rate warm-up (e.g. linear over the first 1-5% of steps)")
    fixes.append("check the loss scale and reduction (a sum over a growing batch grows too)")
    severity = "error" if factor >= ERROR_FACTOR else "warning"
    return [
        Diagnosis(
            kind="divergence",
            severity=severity,
            step=int(steps[-1]),
            summary=(
                f"The loss is diverging: {now:.4g} now against {best:.4g} at step {first_step} "
                f"({factor:.3g}x in {since} steps); it will overflow to Inf/NaN soon."
            ),
            evidence=evidence,
            fix=fixes,
            key="divergence",
        )
    ]
