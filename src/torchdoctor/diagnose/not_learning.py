"""`not_learning`: after a warm-up the loss has not moved from where it started, while
gradients do flow (a run that improved and then converged is not flagged). It describes the
run as it stands: once the loss falls, it is resolved (`RESOLVES`). Not judged on a rollout
(rollout.py: an RL loop's loss is not a learning curve)."""

from __future__ import annotations

import dataclasses

import numpy as np

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.rollout import is_rollout
from torchdoctor.diagnose.series import finite
from torchdoctor.diagnose.story import RAISE_LR, lr_now

RESOLVES = True  # a finding it no longer returns has stopped being true (the doctor marks it)
MIN_STEPS = 100
WINDOW = 20
IMPROVEMENT = 0.02  # less than 2% better than at the start counts as flat


@kind("not_learning")
@dataclasses.dataclass(kw_only=True)
class NotLearningEvidence(Evidence):
    start_loss: float
    loss: float
    best_loss: float
    steps: int
    lr: float | None = None
    grad_norm: float | None = None


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    steps, loss = finite(inputs, "loss")
    if loss.size < MIN_STEPS:
        return []
    start = loss[2 : 2 + WINDOW]
    end = loss[-WINDOW:]
    first, last = float(np.mean(start)), float(np.mean(end))
    if first <= 0:
        return []
    # The best any window reached: a run that learned and then plateaued is fine.
    windows = np.lib.stride_tricks.sliding_window_view(loss[2:], WINDOW).mean(axis=1)
    best = float(windows.min())
    noise = float(np.std(end)) / np.sqrt(WINDOW) + float(np.std(start)) / np.sqrt(WINDOW)
    if first - best > max(IMPROVEMENT * first, 2 * noise):
        return []
    _s, norms = finite(inputs, "grad_norm")
    if not norms.size or float(np.median(norms[-WINDOW:])) <= 0:
        return []  # no gradients at all: other diagnoses say why
    if is_rollout(inputs):
        return []  # a loss summed over episodes of changing length: not a learning curve
    _l, lrs = finite(inputs, "lr")
    lr = float(lrs[-1]) if lrs.size else None
    fixes = []
    if lr == 0:
        fixes.append("the learning rate is 0: check the scheduler and the optimizer's lr")
    fixes += [
        "overfit one batch: a correct model drives the loss near zero within ~100 steps on it",
        f"{RAISE_LR} {lr_now(lr)}" if lr != 0 else "check the learning rate",
        "check that the optimizer holds this model's parameters (built after re-creating the "
        "model?) and that no needed layer is frozen",
        "check the loss against the outputs: CrossEntropyLoss wants raw logits and class "
        "indices; labels must match inputs (shuffled separately?)",
    ]
    return [
        Diagnosis(
            kind="not_learning",
            severity="warning",
            step=int(steps[-1]),
            summary=(
                f"The loss is not going down: {last:.4g} after {loss.size} steps against "
                f"{first:.4g} at the start (best {best:.4g}), although gradients flow "
                f"(norm {float(np.median(norms[-WINDOW:])):.3g})."
            ),
            evidence=NotLearningEvidence(
                start_loss=first,
                loss=last,
                best_loss=best,
                steps=int(loss.size),
                lr=lr,
                grad_norm=float(np.median(norms[-WINDOW:])),
            ),
            fix=fixes,
            key="not_learning",
        )
    ]
