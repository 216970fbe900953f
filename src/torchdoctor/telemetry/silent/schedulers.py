"""Learning-rate schedulers: stepped before their optimizer, never stepped, or bound to an
optimizer that never steps (one built before the optimizer was re-created).

The lookups of the schedulers' `step()` are watched (hooks.py). A scheduler's constructor
calls its own step() once (`_step_count` is 0 then): that call names the scheduler, the line
that built it and its optimizer. Its first call after that is checked at once: when no
optimizer has stepped yet (and GradScaler skipped no step, which would explain it), the
schedule's first value is skipped (`silent.scheduler_order`). ReduceLROnPlateau is left out
of that: its step() takes a metric, not a place in a schedule.

A summary of every scheduler (how often it was stepped, whether its optimizer steps) is
written at steps 2 and 50, then at each doubling of the step count, when a scheduler is
stepped for the second time, and when the run ends
(`silent.schedulers`): the diagnosis decides from the latest one whether a scheduler was never
stepped, or drives an optimizer that never steps.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import site, user_frame

if TYPE_CHECKING:
    from types import FrameType


FIRST_SUMMARY, SECOND_SUMMARY = 2, 50


@dataclasses.dataclass
class Info:
    kind: str
    site: str | None  # where it was built
    optimizer: Any  # weakref to its optimizer
    calls: int = 0  # step() calls after construction
    first_site: str | None = None  # where it was first stepped


class Schedulers:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.known: weakref.WeakKeyDictionary[Any, Info] = weakref.WeakKeyDictionary()
        self.next_summary = FIRST_SUMMARY

    def on_step(self, scheduler: Any, frame: FrameType) -> None:
        """A scheduler's step() is about to run (its construction's own call included), called
        from `frame`."""
        info = self.known.get(scheduler)
        building = getattr(scheduler, "_step_count", None) == 0
        if info is None:
            optimizer = getattr(scheduler, "optimizer", None)
            try:
                ref = weakref.ref(optimizer) if optimizer is not None else None
            except TypeError:
                ref = None
            where = site(user_frame(frame)) if building else None
            info = Info(type(scheduler).__name__, where, ref)
            self.known[scheduler] = info
        if building:
            return
        info.calls += 1
        if info.calls == 1:
            info.first_site = site(user_frame(frame))
            self._order(info)
        elif info.calls == 2:
            self.summary(self.host.rec.step)

    def _order(self, info: Info) -> None:
        rec = self.host.rec
        optimizer = info.optimizer() if info.optimizer is not None else None
        if info.kind == "ReduceLROnPlateau" or optimizer is None or rec.skipped_steps:
            return
        if rec.optimizers.known():
            return  # another optimizer trains already: a scheduler bound to an idle one
            # (scheduler_unused), not one stepped too early
        data = {
            "scheduler": info.kind,
            "site": info.first_site,
            "created": info.site,
            "step": rec.step,
            "updates": rec.steps_done,
        }
        self.host.emit("scheduler_order", data, key=id(info))

    def _stepped(self, optimizer: Any) -> bool:
        """Whether the optimizer (or the one it wraps: Accelerate's, Lightning's) has stepped."""
        stepped = self.host.rec.optimizers.stepped
        for _ in range(4):
            if optimizer is None:
                return False
            if stepped(optimizer):
                return True
            optimizer = getattr(optimizer, "optimizer", None)
        return False

    def step_ended(self, step: int) -> None:
        if step < self.next_summary:
            return
        self.next_summary = SECOND_SUMMARY if step < SECOND_SUMMARY else 2 * step
        self.summary(step)

    def summary(self, step: int) -> None:
        """What every scheduler has done so far (also when the run ends)."""
        if not len(self.known):
            return
        rec = self.host.rec
        schedulers = []
        for info in list(self.known.values()):
            optimizer = info.optimizer() if info.optimizer is not None else None
            stepped = optimizer is not None and self._stepped(optimizer)
            schedulers.append(
                {
                    "scheduler": info.kind,
                    "site": info.site,
                    "calls": info.calls,
                    "optimizer_stepped": stepped,
                    "optimizer": self.host.label(optimizer) if stepped else None,
                }
            )
        data = {"step": step, "updates": rec.steps_done, "schedulers": schedulers}
        self.host.emit("schedulers", data)
