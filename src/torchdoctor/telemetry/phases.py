"""Exclusive time per phase of the step in progress.

Phases nest: the closure LBFGS calls inside `optimizer.step()` runs a forward and a backward,
and their time is not the optimizer's. Opening a phase pauses the one around it; closing it
resumes the outer one. `forward` is a segment rather than a call: it opens at a model call
and ends when anything else starts (backward, a data fetch, an optimizer step) or the step
ends, so it covers the forward pass and the loss computation.
"""

from __future__ import annotations

from typing import Any

# phase name -> the python.steps column its time goes to
COLUMN = {
    "data": "data_wait",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
}
PHASES = tuple(COLUMN.values())


def zero() -> dict[str, float]:
    return dict.fromkeys(PHASES, 0.0)


class PhaseTimer:
    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: list[list[Any]] = []  # [phase, running since (None while paused)]

    @property
    def phase(self) -> str:
        """What runs now: data, forward, backward, optimizer or other."""
        return self._open[-1][0] if self._open else "other"

    # The hot path calls these a few times per step: plain loops, no helper calls.
    def inside(self, phase: str) -> bool:
        for entry in self._open:  # noqa: SIM110 (a generator costs a frame per call)
            if entry[0] == phase:
                return True
        return False

    def enter(self, phase: str, now: float, totals: dict[str, float]) -> None:
        opened = self._open
        if opened and opened[-1][0] == "forward":  # anything else starting ends the forward
            totals["forward"] += now - opened.pop()[1]
        if opened:
            top = opened[-1]
            if top[1] is not None:
                totals[COLUMN[top[0]]] += now - top[1]
            top[1] = None
        opened.append([phase, now])

    def exit(self, phase: str, now: float, totals: dict[str, float]) -> None:
        opened = self._open
        if opened and opened[-1][0] == "forward" and phase != "forward":
            self.end_forward(now, totals)
        if opened and opened[-1][0] == phase:  # the usual case: it is the innermost
            since = opened.pop()[1]
            if since is not None:
                totals[COLUMN[phase]] += now - since
            if opened:
                opened[-1][1] = now
            return
        if not self.inside(phase):
            return  # opened before a reset (the telemetry was switched on mid-call)
        while opened:
            name, since = opened.pop()
            if since is not None:
                totals[COLUMN[name]] += now - since
            if name == phase:
                break
        if opened:
            opened[-1][1] = now

    def begin_forward(self, now: float, totals: dict[str, float]) -> bool:
        """Open the forward segment unless it is open; True when it was opened now."""
        if self._open and self._open[-1][0] == "forward":
            return False
        self.enter("forward", now, totals)
        return True

    def end_forward(self, now: float, totals: dict[str, float]) -> None:
        if self._open and self._open[-1][0] == "forward":
            _name, since = self._open.pop()
            totals["forward"] += now - since
            if self._open:
                self._open[-1][1] = now

    def reset(self) -> None:
        self._open.clear()
