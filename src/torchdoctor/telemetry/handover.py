"""The updates of other optimizers since the primary's last one, held until it is known whose
steps they are (optimizers.py: an optimizer that makes HANDOVER updates in a row, the
primary none, becomes the primary).

When the primary steps again they were another optimizer's updates inside its iterations (a
GAN's generator): each becomes its row of python.optimizer_steps, as it would have at once.
When one of them takes over, its earlier updates in the window were steps of a training phase
of its own (the next layer of a layer-wise training, the next fold of a k-fold run): each
becomes a step of its own, with its loss, gradient norm and the phases measured up to its end,
and the step in progress keeps what came after the last of them. Before, they were one step
(mnist_forward_forward's second layer: 19 updates in one row).

Held rows are written when the recording ends too; a process killed meanwhile loses them (at
most HANDOVER - 1 updates of each other optimizer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.telemetry.gradient_check import Check
from torchdoctor.telemetry.step import StepState


@dataclasses.dataclass
class Held:
    """Another optimizer's update, as its python.optimizer_steps row would record it, and
    where the step in progress stood when it ended."""

    optimizer: Any
    step: int  # the iteration it belongs to, as things stood (optimizers.py: lag)
    label: str
    losses: list[Any]  # the backward() calls since the last update of any optimizer
    check: Check | None
    seconds: float  # in its step()
    lr: float | None
    guarded: bool
    end: float  # perf_counter when its step() returned
    phases: dict[str, float]  # the step in progress's phases then (a copy)


class Handover:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.held: list[Held] = []

    def hold(self, update: Held) -> None:
        self.held.append(update)

    def flush(self) -> None:
        """The held updates are another optimizer's, in the primary's iterations: their rows.
        (Every update of the primary asks: most hold nothing.)"""
        if not self.held:
            return
        rec, held, self.held = self.rec, self.held, []
        for u in held:
            rec.rows.other_update(
                u.step, u.label, u.losses, u.check, (u.seconds, u.lr), u.guarded, rec.rank
            )

    def take_over(self, optimizer: Any) -> None:
        """`optimizer` is the primary now: its held updates become steps, before the step in
        progress (which its current update will end); the others' stay their rows."""
        rec, state = self.rec, self.rec.state
        mine = [u for u in self.held if u.optimizer is optimizer]
        self.held = [u for u in self.held if u.optimizer is not optimizer]
        self.flush()
        start = state.start
        before: dict[str, float] = {}  # the phases up to the update before (none yet: zero)
        for u in mine:
            done = StepState(start)
            for name, seconds in u.phases.items():
                done.phases[name] = seconds - before.get(name, 0.0)
            done.losses = list(u.losses)
            if u.check is not None:
                done.grad_norm, done.grad_norm_value = u.check.norm, u.check.value
            done.update = (optimizer, u.seconds)
            rec.finish_state(done, u.end)
            start, before = u.end, u.phases
        if mine:  # the step in progress: what came after the last of them
            for name in state.phases:
                state.phases[name] = max(0.0, state.phases[name] - before.get(name, 0.0))
            state.start = start
            state.losses = state.losses[state.claimed :]
            state.claimed = 0
