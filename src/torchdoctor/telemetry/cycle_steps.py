"""Steps of a loop without an optimizer step we can see (`cycle` mode): parameters updated by
hand, or an optimizer inside a compiled function. A step ends where the gradients are reset
between two backward() calls; backward() calls with no reset between them are micro-batches of
one step (gradient accumulation).

How a reset is told: after each backward(), one parameter the loss reaches is the probe; its
gradient's identity and version are kept. At the next data fetch or model call (the next step
may begin there) or the next backward(), a gradient that is gone (`grad = None`), replaced or
changed in place (`zero_()`) since then means the update happened: the step is over. When that
cannot be known yet at a data fetch (the gradient is still the same object, so this may be the
next micro-batch), the step in progress is split off as `closing` and decided at the next
backward(): merged back if the gradient was not reset after all, ended otherwise.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torchdoctor.telemetry.step import StepState


class CycleHost(Protocol):
    """What cycle mode needs from the Recorder (its state is changed only through these)."""

    state: StepState  # of the step in progress (read)
    models: Any
    gradients: Any
    timer: Any

    def end_step(self, now: float, skipped: bool) -> None: ...
    def finish_state(self, state: StepState, end: float) -> None: ...
    def split_state(self, now: float) -> Any: ...
    def merge_state(self, closing: Any) -> None: ...
    def read_now(self) -> bool: ...
    def judge(self, check: Any, guard: bool) -> None: ...


class CycleSteps:
    def __init__(self, host: CycleHost) -> None:
        self.host = host
        self.closing: Any = None  # a StepState split off at a data fetch or model call
        self.probe: Any = None  # (weakref to a parameter, id of its grad, grad version)
        self.backward_end = 0.0
        self._params: tuple[int, list[Any]] = (-1, [])  # (models.version, their parameters)

    def activity(self, now: float) -> None:
        """A data fetch or model call: the first one after a backward() may start the next
        step (the gradients tell, now or at the next backward())."""
        host = self.host
        if not host.state.micro or self.closing is not None or host.timer.inside("optimizer"):
            return
        if self._reset():
            host.end_step(now, skipped=False)
        else:
            self.closing = host.split_state(now)

    def before_backward(self, now: float, loss: Any) -> None:
        host = self.host
        closing = self.closing
        if closing is not None:
            self.closing = None
            if self._reset():
                host.finish_state(closing, host.state.start or now)
            else:
                host.merge_state(closing)
        elif host.state.micro and self._reset():
            host.end_step(now, skipped=False)
        if self.probe is None:
            self.probe = _leaf_of(loss)

    def after_backward(self, now: float) -> None:
        """Remember the probe's gradient, and check this backward's gradients."""
        self.backward_end = now
        host = self.host
        probe = self.probe
        param = probe[0]() if probe else None
        grad = getattr(param, "grad", None)
        self.probe = (probe[0], id(grad), grad._version) if grad is not None else None
        version, params = self._params
        if version != host.models.version:
            params = [p for model, _label in host.models.models() for p in model.parameters()]
            self._params = (host.models.version, params)
        if params:
            host.judge(host.gradients.of_params(0, params, read_now=host.read_now()), False)

    def flush(self, merge: bool) -> None:
        """Leave cycle mode (an optimizer or torchdoctor.step() takes over), or end the run:
        a split-off step is merged back (`merge`) or ended."""
        closing, self.closing = self.closing, None
        if closing is None:
            return
        if merge:
            self.host.merge_state(closing)
        else:
            self.host.finish_state(closing, self.host.state.start or time.perf_counter())

    def _reset(self) -> bool:
        """Whether the gradients seen after the last backward() were cleared or replaced."""
        probe = self.probe
        if probe is None or len(probe) != 3:
            return True  # nothing to compare with: each backward() is a step
        grad = getattr(probe[0](), "grad", None)
        return grad is None or id(grad) != probe[1] or grad._version != probe[2]


def _leaf_of(loss: Any, limit: int = 256) -> Any:
    """(weakref to) a parameter the loss's graph reaches: its gradient tells a reset (a new
    step) from accumulation (a micro-batch)."""
    todo = [getattr(loss, "grad_fn", None)]
    seen = 0
    while todo and seen < limit:
        node = todo.pop()
        if node is None:
            continue
        seen += 1
        variable = getattr(node, "variable", None)
        if variable is not None:
            try:
                return (weakref.ref(variable),)
            except TypeError:
                return None
        todo.extend(n for n, _ in node.next_functions)
    return None
