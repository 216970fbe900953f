"""Device values read back without waiting for the device.

A tensor on a GPU is copied to pinned host memory asynchronously and an event is recorded
after the copy; `poll()` hands the values to their callback once the event has completed.
Callbacks run in submission order. CPU tensors are handed over at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

Done = Callable[[list[float]], None]


class Readback:
    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._pending: deque[tuple[Any, Any, Done]] = deque()

    def submit(self, values: Any, done: Done) -> None:
        """`values`: a 1-D float tensor; `done(list_of_floats)` runs when it is readable."""
        if values.device.type != "cuda":
            done(values.tolist())
            return
        torch = self._torch
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((host, event, done))

    def poll(self, force: bool = False) -> None:
        """Hand over what has landed; `force` waits for the rest (at the end of a run)."""
        while self._pending:
            host, event, done = self._pending[0]
            if force:
                event.synchronize()
            elif not event.query():
                return
            self._pending.popleft()
            done(host.tolist())

    def __len__(self) -> int:
        return len(self._pending)
