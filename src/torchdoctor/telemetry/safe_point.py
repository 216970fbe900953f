"""Calls that another thread (the probe's `eval`) wants run on the training thread between two
steps, where the training's state is one step's: no backward is half done, no `.grad` is being
set to None under the caller's feet.

The training thread looks at `pending` once per step (one attribute check while nothing waits)
and runs what is queued; the caller never blocks the training thread: it waits on its own
thread and may withdraw a call that has not been taken yet (the training is not stepping).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Call:
    """One queued call: `taken` is set when the training thread picks it up, `done` when it
    has run; then `result` is what it returned and `after_step` the step it followed."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.taken = threading.Event()
        self.done = threading.Event()
        self.result: Any = None
        self.after_step: int | None = None


class SafePoint:
    def __init__(self) -> None:
        self.pending: list[Call] = []  # read without the lock: an empty list is the fast path
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> Call:
        call = Call(fn)
        with self._lock:
            self.pending = [*self.pending, call]
        return call

    def withdraw(self, call: Call) -> bool:
        """Take back a call not yet picked up (True); False when the training thread has it."""
        with self._lock:
            if call.taken.is_set():
                return False
            self.pending = [c for c in self.pending if c is not call]
            return True

    def drain(self, after_step: int, switch: Any = None) -> None:
        """On the training thread, at a step boundary: run every queued call, in order, with
        `switch` (the telemetry's) off: what they call (a forward, a backward) is theirs, not
        a step of the training."""
        if switch is None:
            self._drain(after_step)
            return
        was_on, switch.on = switch.on, False
        try:
            self._drain(after_step)
        finally:
            switch.on = was_on

    def _drain(self, after_step: int) -> None:
        with self._lock:
            calls, self.pending = self.pending, []
            for call in calls:
                call.taken.set()
        interrupted: BaseException | None = None
        for call in calls:
            try:
                if interrupted is None:
                    call.result = call.fn()
                else:
                    call.result = interrupted
            except BaseException as exc:  # the caller gets it; the training goes on...
                call.result = exc
                if isinstance(exc, KeyboardInterrupt):
                    interrupted = exc
            finally:
                call.after_step = after_step
                call.done.set()
        if interrupted is not None:  # ...unless it is the user's Ctrl-C: that one is the
            raise KeyboardInterrupt from None  # training's (a fresh one: the caller has the other)
