"""Exclusive time per phase of the step in progress, and the gaps between phases.

Phases nest: the closure LBFGS calls inside `optimizer.step()` runs a forward and a backward,
and their time is not the optimizer's. Opening a phase pauses the one around it; closing it
resumes the outer one. `forward` is the time inside the models' top-level calls: it opens at a
model's forward pre-hook and closes at its forward hook (a model called inside a model counts
once). What runs after the model returns and before backward() (a loss computed outside the
model, fetching the next batch) is no phase: it is `other`. `evaluation` is the same for a
model call with gradients off (torch.no_grad(), inference_mode: an evaluation pass), so that a
validation loop between two steps is not counted as the next step's forward.

A gap is the time while no phase is open; it is named by the phase that closed last ("start"
for the gap that opens the step). When stack samples found that a gap is spent in an input
function that is not a DataLoader (gap_sampler.py), `input_shares` holds that gap's share, and
that share of each such gap is booked as data_wait from then on.

The hooks call the timer a few times a step: `new_timer()` gives the compiled one
(native/phases.cpp, the same methods and results: tests/unit/test_phases.py runs both) where the
native module is built, this class elsewhere.
"""

from __future__ import annotations

from typing import Any, cast

from torchdoctor import native

# phase name -> the python.steps column its time goes to
COLUMN = {
    "data": "data_wait",
    "forward": "forward",
    "evaluation": "evaluation",
    "backward": "backward",
    "optimizer": "optimizer",
}
PHASES = tuple(COLUMN.values())
START = "start"  # the gap that opens a step (before its first phase)
SEGMENTS = ("forward", "evaluation")  # a model's top-level call, with gradients on or off


def zero() -> dict[str, float]:
    return dict.fromkeys(PHASES, 0.0)


class PhaseTimer:
    __slots__ = ("_open", "after", "input_shares", "since")

    def __init__(self) -> None:
        # [phase, running since (None while paused), model calls open (segments only)]
        self._open: list[list[Any]] = []
        self.after = START  # the gap running now (while no phase is open) follows this phase
        self.since = 0.0  # ... since then
        self.input_shares: dict[str, float] = {}  # gap -> share of it booked as data_wait

    @property
    def phase(self) -> str:
        """What runs now: data, forward, backward, optimizer or other."""
        return self._open[-1][0] if self._open else "other"

    @property
    def gap(self) -> str | None:
        """The gap running now (named by the phase that closed before it), or None while a
        phase is open (read from other threads: the gap sampler)."""
        return None if self._open else self.after

    # The hot path calls these a few times per step: plain loops, no helper calls.
    def inside(self, phase: str) -> bool:
        for entry in self._open:  # noqa: SIM110 (a generator costs a frame per call)
            if entry[0] == phase:
                return True
        return False

    def enter(self, phase: str, now: float, totals: dict[str, float]) -> None:
        opened = self._open
        if opened:
            top = opened[-1]
            if top[1] is not None:
                totals[COLUMN[top[0]]] += now - top[1]
            top[1] = None
        elif self.input_shares:  # a gap ends: an input function's share of it is data
            share = self.input_shares.get(self.after)
            if share:
                totals["data_wait"] += (now - self.since) * share
        opened.append([phase, now, 1])

    def exit(self, phase: str, now: float, totals: dict[str, float]) -> None:
        opened = self._open
        if opened and opened[-1][0] == phase:  # the usual case: it is the innermost
            since = opened.pop()[1]
            if since is not None:
                totals[COLUMN[phase]] += now - since
            if opened:
                opened[-1][1] = now
            else:
                self.after = phase
                self.since = now
            return
        if not self.inside(phase):
            return  # opened before a reset (the telemetry was switched on mid-call)
        while opened:
            entry = opened.pop()
            if entry[1] is not None:
                totals[COLUMN[entry[0]]] += now - entry[1]
            if entry[0] == phase:
                break
        if opened:
            opened[-1][1] = now
        else:
            self.after = phase
            self.since = now

    def begin_forward(self, now: float, totals: dict[str, float], segment: str = "forward") -> bool:
        """A model's top-level call begins: its segment (forward, or evaluation for a call with
        gradients off) opens, unless a model call is open already (a model called inside a
        model); True when it was opened now."""
        opened = self._open
        if opened and opened[-1][0] in SEGMENTS:
            opened[-1][2] += 1
            return False
        self.enter(segment, now, totals)
        return True

    def end_forward(self, now: float, totals: dict[str, float]) -> None:
        """A model's top-level call returned (its forward hook): its segment closes when it was
        the outermost model call."""
        opened = self._open
        if opened:
            top = opened[-1]
            name = top[0]
            if name in SEGMENTS:  # the usual case, inline: it runs every step
                if top[2] > 1:
                    top[2] -= 1
                    return
                opened.pop()
                if top[1] is not None:
                    totals[name] += now - top[1]
                if opened:
                    opened[-1][1] = now
                else:
                    self.after = name
                    self.since = now
                return
        self.exit("forward", now, totals)

    def step_ended(self, now: float, totals: dict[str, float]) -> None:
        """The step's end: a model call still open (it raised past its hook, or the step ended
        inside it) closes; the gap running now is booked; the next step opens with its own."""
        opened = self._open
        if opened and opened[-1][0] in SEGMENTS:
            name, since, _calls = opened.pop()
            if since is not None:
                totals[name] += now - since
            if opened:
                opened[-1][1] = now
            else:  # the gap after it begins now: nothing of it is booked below
                self.after, self.since = name, now
        if not opened:
            if self.input_shares:
                share = self.input_shares.get(self.after)
                if share:
                    totals["data_wait"] += (now - self.since) * share
            self.after = START
            self.since = now

    def reset(self) -> None:
        self._open.clear()
        self.after = START


def new_timer() -> PhaseTimer:
    """The compiled timer where the native module is built, else PhaseTimer."""
    kernels = native.load()
    return PhaseTimer() if kernels is None else cast(PhaseTimer, kernels.PhaseTimer())
