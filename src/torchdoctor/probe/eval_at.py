"""Where `eval` runs. `step`: on the training thread at the next step boundary, so the state it
reads is one step's (no `.grad` set to None between two reads of it). `now`: at once on the
probe's thread, racing the training as any other thread would. `auto` (the default): at the
step boundary while the training is stepping, at once when it is not (stuck, or still
starting): a hung run is what one most wants to look into, and it has no step boundary to wait
for. The answer says which, and where the training thread was when it did not step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from torchdoctor.probe.activity import doing
from torchdoctor.telemetry.safe_point import SafePoint
from torchdoctor.telemetry.step_rows import StepHeadline

AT_CHOICES = ("auto", "step", "now")
STEPS_WAITED = 3  # auto waits up to this many usual step times for a boundary...
MIN_WAIT = 1.0  # ...but at least this long (short steps are noisy)...
MAX_WAIT = 10.0  # ...and at most this long (a slow step is not worth a longer wait)
NOT_STEPPING = "ran on the probe thread: training not stepping"
STARTING = "ran on the probe thread: the script is still starting"
STEP_WAIT = 20.0  # `step` waits this long at most (the CLI gives up on an answer at 30 s)


class Training(Protocol):
    """What eval needs of the training: its safe point and its latest step's timing."""

    safe_point: SafePoint
    train_thread: int | None  # the thread that steps

    @property
    def last(self) -> StepHeadline | None: ...


@dataclasses.dataclass
class Placement:
    where: str  # "step" (the training thread) or "probe" (the probe's thread)
    after_step: int | None  # the step the eval followed, where it ran at a boundary
    note: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class TrainingInterrupted(Exception):
    """Ctrl-C came while the code ran on the training thread: the training has it."""


class NoStepBoundary(Exception):
    """`step` asked for and no boundary came: nothing was run."""


def wait_for(last: StepHeadline) -> float:
    """How long auto waits for a step boundary, given the latest step's row."""
    duration = last.duration or 0.0
    return min(MAX_WAIT, max(MIN_WAIT, STEPS_WAITED * duration))


def _starting(training: Training | None) -> str:
    """`(importing torch, from train.py:3)`: what the script does before its first step."""
    where = doing(training.train_thread if training is not None else None)
    return f"({where or 'no step yet'})"


def _why(what: str, training: Training | None) -> str:
    """`what`, and where the training thread is meanwhile (in evaluate() at train.py:55)."""
    where = doing(training.train_thread if training is not None else None)
    return f"{what}; {where}" if where else what


def run(fn: Callable[[], Any], at: str, training: Training | None) -> tuple[Any, Placement]:
    """Run `fn` where `at` says; never blocks the training thread (the waiting is ours)."""
    if at == "now":
        return fn(), Placement("probe", None, "ran on the probe thread (--at now)")
    last = training.last if training is not None else None
    if training is None or last is None:
        if at == "step" and training is None:
            raise NoStepBoundary(
                f"the script is still starting {_starting(training)}: no step to wait for yet"
            )
        if at == "auto":
            return fn(), Placement("probe", None, f"{STARTING} {_starting(training)}")
    assert training is not None
    if at == "auto" and last is not None:
        limit = wait_for(last)
        since = time.time() - last.time
        if since > limit:  # stuck now: answer at once
            why = _why(f"no step for {since:.1f} s", training)
            return fn(), Placement("probe", None, f"{NOT_STEPPING} ({why})")
    else:
        limit = STEP_WAIT
    call = training.safe_point.submit(fn)
    if call.taken.wait(limit) or not training.safe_point.withdraw(call):
        call.done.wait()  # the training thread runs it now: its answer is coming
        if isinstance(call.result, KeyboardInterrupt):
            raise TrainingInterrupted from None
        if isinstance(call.result, BaseException):
            raise call.result
        note = f"ran at the step boundary after step {call.after_step}"
        return call.result, Placement("step", call.after_step, note)
    if at == "step":
        raise NoStepBoundary(
            f"no step boundary within {limit:g} s: nothing was run (--at now runs at once)"
        )
    note = f"{NOT_STEPPING} ({_why(f'no step boundary within {limit:.1f} s', training)})"
    return fn(), Placement("probe", None, note)
