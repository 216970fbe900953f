"""Exclusive time per phase of the step in progress.

Phases nest: the closure LBFGS calls inside `optimizer.step()` runs a forward and a backward,
and their time is not the optimizer's. Opening a phase pauses the one around it; closing it
resumes the outer one. `forward` is a segment rather than a call: it opens at a model call
and ends when anything else starts (backward, a data fetch, an optimizer step) or the step
ends, so it covers the forward pass and the loss computation. `evaluation` is the same segment
for a model call with gradients off (torch.no_grad(), inference_mode: an evaluation pass), so
that a validation loop between two steps is not counted as the next step's forward.
"""

from __future__ import annotations

from typing import Any

# phase name -> the python.steps column its time goes to
COLUMN = {
    "data": "data_wait",
    "forward": "forward",
    "evaluation": "evaluation",
    "backward": "backward",
    "optimizer": "optimizer",
}
PHASES = tuple(COLUMN.values())
SEGMENTS = ("forward", "evaluation")  # end when anything else starts


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
        if opened and opened[-1][0] in SEGMENTS:  # anything else starting ends the segment
            name, since = opened.pop()
            totals[name] += now - since
        if opened:
            top = opened[-1]
            if top[1] is not None:
                totals[COLUMN[top[0]]] += now - top[1]
            top[1] = None
        opened.append([phase, now])

    def exit(self, phase: str, now: float, totals: dict[str, float]) -> None:
        opened = self._open
        if opened and opened[-1][0] in SEGMENTS and phase != opened[-1][0]:
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

    def begin_forward(self, now: float, totals: dict[str, float], segment: str = "forward") -> bool:
        """Open the `segment` (forward, or evaluation for a call with gradients off) unless it
        is open; True when it was opened now."""
        if self._open and self._open[-1][0] == segment:
            return False
        self.enter(segment, now, totals)
        return True

    def end_forward(self, now: float, totals: dict[str, float]) -> None:
        """End the forward or evaluation segment, if one is open."""
        if self._open and self._open[-1][0] in SEGMENTS:
            name, since = self._open.pop()
            totals[name] += now - since
            if self._open:
                self._open[-1][1] = now

    def reset(self) -> None:
        self._open.clear()
