"""`exploding_gradients`: the total gradient norm far above its usual level, and the module (on
traced steps) whose gradient grew most.

Judged step by step over the recent history, so the step reported is the first at which the
rule held: 3 steps in a row at least 10x the usual norm, or one step at least 1000x. The usual
norm is the median of the 50 steps up to the lowest norm of the 100 steps before the ones
judged: where a climb began, if the norm has been climbing (a norm that has grown for 40 steps
is compared with where it was before, not with its own growth), or just a low point of the
noise. With fewer than 10 steps of history the bar is 100x, since there is no usual level yet.

When the learning rate at least doubled between the usual level and the steps judged (a
warm restart, a cyclic schedule), the norm must also be at least twice the highest level
(median of 5 steps) of the whole run before: after a restart the norm goes back toward where
it was at the start, which is not an explosion; a schedule that multiplies the rate past
anything before still is. And the norm must reach at least a tenth of that highest level: the
gradients of a run that has converged are tiny, and ten times tiny (Adam's occasional kicks at
a loss of 1e-6) is not what clipping is for.

On a rollout (rollout.py: an RL policy fed one observation at a time, updated once per
episode) the norm grows with the episode's length, so only the 1000x spike counts there.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.rollout import is_rollout
from torchdoctor.diagnose.series import finite, median5, median5_summary
from torchdoctor.diagnose.story import CLIP_NORM, LOWER_LR

HISTORY = 10  # steps of history for the usual level to count as one
SUSTAINED = 3  # consecutive steps above FACTOR
FACTOR = 10.0
EARLY_FACTOR = 100.0  # the bar while the history is shorter than HISTORY
SPIKE = 1000.0  # a single step this far above is enough (and is an error)
WINDOW = 50  # steps the usual level is the median of
CLIMB = 100  # how far back the start of a climb is looked for
SCAN = 4096  # steps judged on each pass (the doctor looks once a second)
LR_JUMP = 2.0  # a learning rate raised this much: judged against twice the run's highest level
TINY = 0.1  # an explosion reaches at least this share of the run's highest level before it


@dataclasses.dataclass
class Detection:
    index: int
    base: float  # the usual norm
    history: int  # steps it was taken over
    factor: float  # how far above it: the judged steps' minimum, or the spike


@kind("exploding_gradients")
@dataclasses.dataclass(kw_only=True)
class ExplodingGradientsEvidence(Evidence):
    grad_norm: float
    typical_grad_norm: float
    typical_over_steps: int
    factor: float
    steps: list[int]
    module_growth: float | None = optional()


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    steps, norms = finite(inputs, "grad_norm")
    found = detections(norms, _lr_at_norms(inputs))
    if found and is_rollout(inputs):
        # the norm of an episode's summed loss grows with the episode: only a spike counts
        found = [d for d in found if d.factor >= SPIKE]
    if not found:
        return []
    module, growth = _worst_module(inputs)
    return [_diagnosis(d, steps, norms, module, growth) for d in found]


def detections(norms: np.ndarray, lr: np.ndarray | None = None) -> list[Detection]:
    """The first detection, and the first of error severity when that came later. `lr`: the
    learning rate at each step of `norms` (NaN where unknown)."""
    n = norms.size
    if n < SUSTAINED + 1:
        return []
    lr = np.full(n, np.nan) if lr is None else lr
    first = max(SUSTAINED, n - SCAN)
    # A cheap bound first: the usual level is at least the minimum of the CLIMB + WINDOW steps
    # before the judged ones, so most steps are ruled out without a median.
    reach = CLIMB + WINDOW
    lo_start = max(0, first - SUSTAINED + 1 - reach)
    # highest[k]: the highest level (median of 5) up to step lo_start + k; older steps summed up.
    m5_from = max(0, lo_start - 4)
    highest = np.fmax.accumulate(median5(norms[m5_from:])[lo_start - m5_from :])
    old = median5_summary(norms[:lo_start]) if lo_start else None
    if old is not None:
        highest = np.fmax(highest, old[3])
    highest = np.nan_to_num(highest, nan=0.0)
    padded = np.concatenate([np.full(reach, np.inf), norms[lo_start:]])
    floor = np.lib.stride_tricks.sliding_window_view(padded, reach).min(axis=1)
    # judged[k]: the lowest of the SUSTAINED steps ending at first + k
    judged = np.lib.stride_tricks.sliding_window_view(
        norms[first - SUSTAINED + 1 :], SUSTAINED
    ).min(axis=1)
    idx = np.arange(first, n)
    low = floor[idx - SUSTAINED + 1 - lo_start]  # min of the `reach` steps before the judged
    maybe = idx[(judged >= FACTOR * low) | (norms[idx] >= SPIKE * low)]
    out: list[Detection] = []
    for i in maybe.tolist():
        d = _judge(norms, lr, highest, lo_start, i, float(judged[i - first]))
        if d is None:
            continue
        if not out or (d.factor >= SPIKE and out[-1].factor < SPIKE):
            out.append(d)
        if d.factor >= SPIKE:
            break
    return out


def _judge(
    norms: np.ndarray, lr: np.ndarray, highest: np.ndarray, h0: int, i: int, lowest: float
) -> Detection | None:
    judged_start = i - SUSTAINED + 1
    search = max(0, judged_start - CLIMB)
    anchor = search + int(np.argmin(norms[search:judged_start]))  # where a climb began
    start, end = max(0, anchor + 1 - WINDOW), anchor + 1
    history = norms[start:end]
    usual_lr = np.median(lr[start:end])
    top = highest[end - 1 - h0]  # the highest level of the run up to the climb
    if lr[judged_start] > LR_JUMP * usual_lr and lowest < LR_JUMP * top:
        return None  # the learning rate went up: back to an earlier level is no explosion
    if float(norms[i]) < TINY * top:
        return None  # a converged run's gradients are tiny: ten times tiny is no explosion
    base = float(np.median(history))
    if base <= 0:
        return None
    ratio, spike = lowest / base, float(norms[i]) / base
    bar = FACTOR if history.size >= HISTORY else EARLY_FACTOR
    if ratio >= bar:
        return Detection(i, base, int(history.size), max(ratio, spike))
    if spike >= SPIKE and history.size >= HISTORY:
        return Detection(i, base, int(history.size), spike)
    return None


def _diagnosis(
    d: Detection, steps: np.ndarray, norms: np.ndarray, module: str | None, growth: float
) -> Diagnosis:
    step = int(steps[d.index])
    evidence = ExplodingGradientsEvidence(
        grad_norm=float(norms[d.index]),
        typical_grad_norm=d.base,
        typical_over_steps=d.history,
        factor=d.factor,
        steps=[int(s) for s in steps[max(0, d.index - SUSTAINED + 1) : d.index + 1]],
    )
    if module is not None:
        evidence.module_growth = growth
    where = f"; the largest growth is in {module} ({growth:.3g}x)" if module else ""
    return Diagnosis(
        kind="exploding_gradients",
        severity="error" if d.factor >= SPIKE else "warning",
        step=step,
        location=module,
        summary=(
            f"Gradients are exploding: total norm {norms[d.index]:.4g} at step {step}, "
            f"{d.factor:.3g}x its usual {d.base:.4g}{where}."
        ),
        evidence=evidence,
        fix=[
            f"{CLIP_NORM}: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
            f"{LOWER_LR} or lengthen the warm-up",
            "check for a missing normalisation (LayerNorm/BatchNorm) or a residual without "
            "scaling in the module named",
            "under float16, use torch.amp.GradScaler (it skips steps with Inf gradients)",
        ],
        key="exploding_gradients",
    )


def _lr_at_norms(inputs: Inputs) -> np.ndarray:
    """The learning rate of each step that has a finite gradient norm (NaN where unknown)."""
    norms = inputs.column("grad_norm").astype(float, copy=False)
    keep = inputs.valid("grad_norm") & np.isfinite(norms)
    lr = inputs.column("lr").astype(float, copy=False)
    known = inputs.valid("lr")
    if not known.all():
        lr = np.where(known, lr, np.nan)
    return lr if keep.all() else lr[keep]


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
