"""Where `eval` runs. `step`: on the training thread at the next step boundary, so the state it
reads is one step's (no `.grad` set to None between two reads of it). `now`: at once on the
probe's thread, racing the training as any other thread would. `auto` (the default): at the
step boundary while the training is stepping, at once when it is not (stuck, or not started):
a hung run is what one most wants to look into, and it has no step boundary to wait for.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from torchdoctor.telemetry.safe_point import SafePoint

AT_CHOICES = ("auto", "step", "now")
STEPS_WAITED = 3  # auto waits up to this many usual step times for a boundary...
MIN_WAIT = 1.0  # ...but at least this long (short steps are noisy)...
MAX_WAIT = 10.0  # ...and at most this long (a slow step is not worth a longer wait)
NOT_STEPPING = "ran on the probe thread: training not stepping"
STEP_WAIT = 20.0  # `step` waits this long at most (the CLI gives up on an answer at 30 s)


class Training(Protocol):
    """What eval needs of the training: its safe point and its latest step's timing."""

    safe_point: SafePoint

    @property
    def last(self) -> dict[str, Any]: ...


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


def wait_for(last: dict[str, Any]) -> float:
    """How long auto waits for a step boundary, given the latest step's row."""
    duration = last.get("duration") or 0.0
    return min(MAX_WAIT, max(MIN_WAIT, STEPS_WAITED * duration))


def run(fn: Callable[[], Any], at: str, training: Training | None) -> tuple[Any, Placement]:
    """Run `fn` where `at` says; never blocks the training thread (the waiting is ours)."""
    if at == "now":
        return fn(), Placement("probe", None, "ran on the probe thread (--at now)")
    if training is None:
        if at == "step":
            raise NoStepBoundary("the training has not started: there is no step to wait for")
        return fn(), Placement("probe", None, "ran on the probe thread: training not started")
    last = training.last
    if at == "auto":
        limit = wait_for(last)
        since = time.time() - last["time"] if last.get("time") is not None else None
        if since is None or since > limit:  # stuck now: answer at once
            why = "no step yet" if since is None else f"no step for {since:.1f} s"
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
    note = f"{NOT_STEPPING} (no step boundary within {limit:.1f} s)"
    return fn(), Placement("probe", None, note)
