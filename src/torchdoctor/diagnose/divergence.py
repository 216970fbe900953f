"""`divergence`: the loss running away, reported while it is still finite.

Two rules, each judged step by step over the whole history, so that the step reported is the
first one at which the rule held, whenever the doctor happens to look (once a second: a fast
run may be many steps further on, or already NaN):

- geometric: at least 4 consecutive rises of >= 1.5x each, the last 3 together >= 500x,
  ending at least 10x above every loss before the climb began. A loss growing tenfold a step
  is caught on the fourth step of its growth. (The first rise does not count toward the 500x:
  a climb that starts from one freakishly low batch is noise, not divergence.)
- sustained: the loss smoothed over 5 steps (a running median: two bad batches never move
  it) >= 100x both its best so far and its median up to that best, >= 10x above every
  smoothed value up to that best, and still rising. This catches slower climbs, and a jump
  followed by ups and downs. (The median matters for noisy losses: the best of a batch-size-1
  loss is a lucky outlier, not a level. Over fewer than 10 steps the median may be one too,
  and the bar is 10^4x.)

Every baseline is taken from the steps before the climb being judged, never from the climb
itself. "Far above anything before" is what tells divergence from the rise after a
learning-rate restart, a warm-up or a noisy batch: those climb back toward where the loss has
been, not an order of magnitude past it.

On a rollout (rollout.py: an RL policy updated once per episode on a loss summed over it) the
loss grows with the episodes: only the error, 10^4x, counts there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.rollout import is_rollout
from torchdoctor.diagnose.series import (
    finite,
    first_true,
    median5,
    median5_summary,
    run_lengths,
)
from torchdoctor.diagnose.story import ADD_CLIPPING, LOWER_LR, WARM_UP
from torchdoctor.diagnose.story import lr_now as said_lr

RISES = 4  # consecutive rises of the geometric rule
RISE = 1.5  # each at least this factor
GEOMETRIC = 500.0  # all but the first together at least this factor
ABOVE = 10.0  # either rule: this far above every loss (smoothed loss) before the climb
WARNING_FACTOR = 100.0  # sustained rule: smoothed loss over its best
ERROR_FACTOR = 1e4  # either rule: the loss reached this far above its baseline
MIN_STEPS = 8  # the sustained rule needs this much history
MIN_HISTORY = 10  # steps before the best for its median to count as the usual level
FLOAT32_MAX = 3.4028235e38
SCAN = 20_000  # steps judged on each pass (the doctor looks once a second); older ones were
LOOKBACK = 1_000  # how long before those a geometric climb may have begun


@dataclasses.dataclass
class Detection:
    rule: str  # geometric or sustained
    index: int  # first index (into the finite losses) where the rule held
    onset: int  # index of the baseline: the start of the climb, or the best loss
    baseline: float  # the loss there
    loss: float  # the loss (smoothed for `sustained`) at detection
    rises: int = 0


@kind("divergence")
@dataclasses.dataclass(kw_only=True)
class DivergenceEvidence(Evidence):
    rule: str
    detected_step: int
    onset_step: int
    onset_loss: float
    loss: float
    factor: float
    growth_per_step: float
    steps_to_float32_overflow: float | None = None
    non_finite_step: int | None = None
    best_loss: float
    best_step: int
    steps_since_onset: int
    lr: float | None = None
    warmup: bool
    grad_norm_at_onset: float | None = None
    grad_norm_now: float | None = None

    def names_step(self) -> int | None:
        return self.non_finite_step


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    """The first step the loss was seen diverging (a warning), and the first step it stood
    10^4x above its baseline (an error), if later."""
    steps, loss = finite(inputs, "loss")
    if loss.size <= RISES:
        return []
    with np.errstate(divide="ignore", invalid="ignore"):
        found = [d for d in (geometric(loss), sustained(loss)) if d is not None]
    if not found:
        return []
    d = min(found, key=lambda f: f.index)
    context = _context(inputs, steps)
    if d.loss >= ERROR_FACTOR * d.baseline:
        return [_diagnosis(d, d.index, "error", steps, loss, context)]
    out = []
    if not is_rollout(inputs):  # an episode's summed loss grows with it: only 10^4x counts
        out.append(_diagnosis(d, d.index, "warning", steps, loss, context))
    worse = first_true(loss[d.index :] >= ERROR_FACTOR * d.baseline)
    if worse is not None:
        out.append(_diagnosis(d, d.index + worse, "error", steps, loss, context))
    return out


def geometric(loss: np.ndarray) -> Detection | None:
    r0 = max(0, loss.size - SCAN - LOOKBACK)  # older steps were judged on earlier passes
    region = loss[r0:]
    positive = region > 0
    logs = np.where(positive, np.log(np.where(positive, region, 1.0)), np.nan)
    rises = run_lengths(np.diff(logs) >= math.log(RISE))  # [j]: rises ending in point j + 1
    point = np.arange(1, region.size)
    start = point - rises
    highest = np.maximum.accumulate(region)  # every loss up to and including a climb's start
    if r0:
        highest = np.maximum(highest, loss[:r0].max())
    second = np.minimum(start + 1, point)
    ok = (
        (rises >= RISES)
        & (logs[point] - logs[second] >= math.log(GEOMETRIC))
        & (region[point] >= ABOVE * highest[start])
    )
    k = first_true(ok)
    if k is None:
        return None
    i, s = r0 + int(point[k]), r0 + int(start[k])
    return Detection("geometric", i, s, float(loss[s]), float(loss[i]), int(rises[k]))


def sustained(loss: np.ndarray) -> Detection | None:
    r0 = max(0, loss.size - SCAN)
    lo = max(0, r0 - 9)  # median5 of the region, and of 5 steps back for "still rising"
    smoothed = median5(loss[lo:])
    region = smoothed[r0 - lo :]
    idx = np.arange(r0, loss.size)
    best = np.fmin.accumulate(region)
    best_at = np.maximum.accumulate(np.where(region <= best, idx, r0))
    highest = np.fmax.accumulate(region)
    old = median5_summary(loss[:r0]) if r0 else None
    if old is not None:
        # The steps before the region, summed up: their best, the highest level up to it,
        # and the highest of all.
        old_best, old_at, old_ceiling, old_highest = old
        highest = np.fmax(highest, old_highest)
        before = (old_best < best) | np.isnan(best)
        ceiling = np.where(before, old_ceiling, highest[best_at - r0])
        best_at = np.where(before, old_at, best_at)
        best = np.where(before, old_best, best)
    else:
        ceiling = highest[best_at - r0]  # the highest level up to the best
    back = smoothed[np.maximum(idx - 5 - lo, 0)]
    earlier = np.where((idx - 5 < lo) | np.isnan(back), -np.inf, back)  # no level 5 back
    ok = (
        (idx >= MIN_STEPS - 1)
        & (best > 0)
        & (region >= WARNING_FACTOR * best)
        & (region >= ABOVE * ceiling)
        & (region > earlier)  # still rising: a jump that settled is not running away
    )
    typical: dict[int, float] = {}
    for k in np.flatnonzero(ok):
        b = int(best_at[k])
        if b not in typical:  # the usual loss before the climb, not just its lowest
            typical[b] = float(np.median(loss[: b + 1]))
        # A usual level taken over a few steps may be a lucky low: ask for more then.
        bar = WARNING_FACTOR if b + 1 >= MIN_HISTORY else ERROR_FACTOR
        if region[k] >= bar * typical[b]:
            return Detection("sustained", r0 + int(k), b, float(best[k]), float(region[k]))
    return None


def _context(inputs: Inputs, steps: np.ndarray) -> dict[str, Any]:
    _s, lr = finite(inputs, "lr")
    norm_steps, norms = finite(inputs, "grad_norm")
    return {
        "lr": float(lr[-1]) if lr.size else None,
        "warmup": bool(lr.size >= 3 and lr[: max(3, lr.size // 4)].max() > lr[0] * 1.01),
        "norms": (norm_steps, norms),
        "non_finite": _non_finite_steps(inputs),
    }


def _diagnosis(
    d: Detection,
    at: int,
    severity: str,
    steps: np.ndarray,
    loss: np.ndarray,
    context: dict[str, Any],
) -> Diagnosis:
    step, detected, onset_step = int(steps[at]), int(steps[d.index]), int(steps[d.onset])
    now = d.loss if at == d.index else float(loss[at])
    factor = now / d.baseline
    rate = (d.loss / d.baseline) ** (1.0 / max(1, d.index - d.onset))
    overflow = math.log(FLOAT32_MAX / now) / math.log(rate) if rate > 1.0 else None
    later = context["non_finite"][context["non_finite"] > step]
    non_finite = int(later[0]) if later.size else None
    lr_now, warmup = context["lr"], context["warmup"]
    norm_steps, norms = context["norms"]
    best = int(np.argmin(loss[: d.index + 1]))
    evidence = DivergenceEvidence(
        rule=d.rule,
        detected_step=detected,
        onset_step=onset_step,
        onset_loss=d.baseline,
        loss=now,
        factor=factor,
        growth_per_step=rate,
        steps_to_float32_overflow=round(overflow, 1) if overflow is not None else None,
        non_finite_step=non_finite,
        best_loss=float(loss[best]) if d.rule == "geometric" else d.baseline,
        best_step=int(steps[best]) if d.rule == "geometric" else onset_step,
        steps_since_onset=step - onset_step,
        lr=lr_now,
        warmup=warmup,
        grad_norm_at_onset=_at(norm_steps, norms, onset_step),
        grad_norm_now=_at(norm_steps, norms, step),
    )
    if d.rule == "geometric":
        summary = (
            f"The loss is diverging: it grew {rate:.3g}x per step for {d.rises} steps, from "
            f"{d.baseline:.4g} at step {onset_step} to {d.loss:.4g} at step {detected}, far "
            "above anything before"
        )
    else:
        summary = (
            f"The loss is diverging: {d.loss:.4g} at step {detected} (median of 5 steps) "
            f"against {d.baseline:.4g} at its best (step {onset_step}), "
            f"{d.loss / d.baseline:.3g}x, still rising and far above anything before"
        )
    if at != d.index:
        summary += f"; at step {step} it stood at {now:.4g} ({factor:.3g}x)"
    if non_finite is not None:
        summary += f"; it went non-finite at step {non_finite}."
    elif overflow is not None:
        summary += f"; at that rate it overflows float32 in about {max(1, round(overflow))} steps."
    else:
        summary += "."
    fixes = [
        f"{LOWER_LR} {said_lr(lr_now)}; a tenth is a good first try",
        f"{ADD_CLIPPING}: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    ]
    if not warmup:
        fixes.insert(1, f"{WARM_UP} (e.g. linear over the first 1-5% of steps)")
    fixes.append("check the loss scale and reduction (a sum over a growing batch grows too)")
    return Diagnosis(
        kind="divergence",
        severity=severity,
        step=step,
        summary=summary,
        evidence=evidence,
        fix=fixes,
        key="divergence",
    )


def _at(steps: np.ndarray, values: np.ndarray, step: int) -> float | None:
    """The value at `step`, or the last one before it."""
    i = int(np.searchsorted(steps, step, side="right")) - 1
    return float(values[i]) if i >= 0 else None


def _non_finite_steps(inputs: Inputs) -> np.ndarray:
    loss = inputs.column("loss").astype(float)
    return np.asarray(inputs.column("step")[inputs.valid("loss") & ~np.isfinite(loss)])
