"""Device values read back without waiting for the device.

GPU values are gathered on the device while steps come quickly and copied back together: one
concatenation, one asynchronous copy to pinned host memory and one event for up to BATCH
submissions, since on a launch-bound GPU step each extra op costs as much host time as the
reading itself (docs/benchmarks.md, "GPU"). Submissions that come slowly (a step of more
than MAX_DELAY) go at once, so a slow run's values are no later than before. `poll()` hands the
values to their callbacks once the copy's event has completed, in submission order. CPU tensors
are handed over at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from torchdoctor._failsafe import first_line, keep_to_exit, warn_once

Done = Callable[[list[float]], None]
Lost = Callable[[], None]

BATCH = 16  # submissions copied back together at most
MAX_DELAY = 0.1  # seconds a submission may wait for others before it is copied back


class Readback:
    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._batch: list[tuple[Any, Done, Lost | None]] = []  # on the device, not copied yet
        self._batch_started = 0.0
        self._last_submit = 0.0
        self._pending: deque[tuple[Any, Any, list[tuple[int, Done, Lost | None]]]] = deque()

    def submit(self, values: Any, done: Done, lost: Lost | None = None) -> None:
        """`values`: a 1-D float tensor made for this (a stack, a cat: nothing changes it
        afterwards, since it may be copied a few steps later); `done(list_of_floats)` runs
        when it is readable, `lost()` instead when it never will be (a GPU context an error
        broke)."""
        if values.device.type != "cuda":
            done(values.tolist())
            return
        if self._batch and self._batch[0][0].device != values.device:
            self._copy_batch()  # one device per copy
        now = time.perf_counter()
        slow = now - self._last_submit >= MAX_DELAY
        self._last_submit = now
        if not self._batch:
            self._batch_started = now
        self._batch.append((values, done, lost))
        if slow or len(self._batch) >= BATCH or now - self._batch_started >= MAX_DELAY:
            self._copy_batch()

    def _copy_batch(self) -> None:
        batch = self._batch
        if not batch:
            return
        torch = self._torch
        parts = [v.reshape(-1) for v, _done, _lost in batch]
        values = torch.cat(parts) if len(parts) > 1 else parts[0]
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        sizes = [(p.numel(), done, lost) for p, (_v, done, lost) in zip(parts, batch, strict=True)]
        # the batch leaves only once its copy is queued: a broken context raises above, and
        # poll_at_end must still find its submissions
        self._batch = []
        self._pending.append((host, event, sizes))

    def poll(self, force: bool = False) -> None:
        """Hand over what has landed; `force` copies and waits for the rest (a run's end)."""
        if self._batch and (force or time.perf_counter() - self._batch_started >= MAX_DELAY):
            self._copy_batch()
        while self._pending:
            host, event, dones = self._pending[0]
            if force:
                event.synchronize()
            elif not event.query():
                return
            self._pending.popleft()
            values, at = host.tolist(), 0
            for n, done, _lost in dones:
                done(values[at : at + n])
                at += n

    def poll_at_end(self) -> None:
        """Wait for the rest; a GPU context an error broke (a device-side assert) has lost
        them: said in one line, and what can do without them (a step's row, its time and
        phases) is still written, through the submissions' `lost`."""
        try:
            self.poll(force=True)
        except Exception as exc:
            unread = [lost for _h, _e, dones in self._pending for _n, _d, lost in dones]
            unread += [lost for _v, _d, lost in self._batch]
            # Freeing a pinned buffer asks the broken context about its event, and an error
            # thrown there ends the process (std::terminate): they are kept to the exit.
            keep_to_exit((self._pending, self._batch))
            self._pending, self._batch = deque(), []
            for lost in unread:
                if lost is not None:
                    try:
                        lost()
                    except Exception:  # ours: the warning below still says what is missing
                        continue
            warn_once(
                "readback-lost",
                f"the last steps' loss and gradient norm are lost ({first_line(exc)}); "
                "their rows are written without them",
            )

    def __len__(self) -> int:
        return len(self._pending) + len(self._batch)
