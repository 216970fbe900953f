"""Device values read back without waiting for the device, and without asking it anything.

GPU values are gathered on the device while steps come quickly and copied back together: one
concatenation and one asynchronous copy to pinned host memory for up to BATCH submissions,
since on a launch-bound GPU step each extra op costs as much host time as the reading itself
(docs/benchmarks.md, "GPU"). Submissions that come slowly (a step of more than MAX_DELAY) go at
once, so a slow run's values are no later than before. `poll()` hands the values to their
callbacks once their copy has landed, in submission order. CPU tensors are handed over at once.

A copy is known to have landed by a mark the device writes after it, on the same stream, into
the same host buffer: reading it is a read of host memory. No CUDA event is queried and no
pinned buffer is allocated or freed after the first ones (the host allocator queries events
when it does). Either would be the first call to learn of an asynchronous device error (a
device-side assert) and make the training's next kernel launch raise it, a line earlier than
without torchdoctor; the training's own synchronizing call meets it first instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from torchdoctor._failsafe import first_line, keep_to_exit, warn_once

Done = Callable[[list[float]], None]
Lost = Callable[[], None]
Submission = tuple[Any, Done, Lost | None]  # (values on the device, done, lost)
# a copy on its way: (pinned host buffer, its numpy view, where its landing mark is, and each
# submission's length and callbacks)
Copy = tuple[Any, Any, int, list[tuple[int, Done, Lost | None]]]

BATCH = 16  # submissions copied back together at most
MAX_DELAY = 0.1  # seconds a submission may wait for others before it is copied back


class Readback:
    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._batch: list[Submission] = []  # on the device, not copied yet
        self._batch_started = 0.0
        self._last_submit = 0.0
        self._pending: deque[Copy] = deque()
        self._free: list[tuple[Any, Any]] = []  # pinned buffers (and views) not in use
        self._owned: list[Any] = []  # every pinned buffer: none is ever freed
        self._marks: dict[tuple[Any, Any], Any] = {}  # (device, dtype) -> a one there
        self._readable = {torch.float16, torch.float32, torch.float64}  # numpy can view them

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

    def after(self, done: Callable[[], None]) -> None:
        """`done()` once the current device has done what was queued on its current stream
        before this call (a traced step's timing events, say), known as the values are."""
        self.submit(self._torch.empty(0, device="cuda"), lambda _values: done())

    def _copy_batch(self) -> None:
        batch, self._batch = self._batch, []  # taken first: a callback run below may submit
        if not batch:
            return
        try:
            self._pending.append(self._copy(batch))
        except BaseException:
            self._batch = batch + self._batch  # a broken context: poll_at_end must find them
            raise

    def _copy(self, batch: list[Submission]) -> Copy:
        torch = self._torch
        parts = [v.reshape(-1) for v, _done, _lost in batch]
        values = torch.cat(parts) if len(parts) > 1 else parts[0]
        if values.dtype not in self._readable:
            values = values.float()  # bfloat16: numpy has no view of it
        n = values.numel()
        host, view = self._buffer(n + 1, values.dtype)
        mark = self._marks.get((values.device, values.dtype))
        if mark is None:
            mark = torch.ones(1, dtype=values.dtype, device=values.device)
            self._marks[values.device, values.dtype] = mark
        view[n] = 0.0  # the device writes 1 there once the values before it are in place
        host[:n].copy_(values, non_blocking=True)
        host[n : n + 1].copy_(mark, non_blocking=True)
        sizes = [(p.numel(), done, lost) for p, (_v, done, lost) in zip(parts, batch, strict=True)]
        return host, view, n, sizes

    def _buffer(self, size: int, dtype: Any) -> tuple[Any, Any]:
        """A pinned buffer of `dtype` and at least `size` elements: a free one, else a new one
        (kept for the process's life, see the module's docstring)."""
        fits = self._fitting(size, dtype)
        if fits is None:
            self._hand_over()  # a copy that landed frees its buffer: fewer to allocate
            fits = self._fitting(size, dtype)
        if fits is not None:
            return fits
        capacity = max(64, 1 << (size - 1).bit_length())
        host = self._torch.empty(capacity, dtype=dtype, pin_memory=True)
        self._owned.append(host)
        return host, host.numpy()

    def _fitting(self, size: int, dtype: Any) -> tuple[Any, Any] | None:
        for i, (host, _view) in enumerate(self._free):
            if host.dtype == dtype and host.numel() >= size:
                return self._free.pop(i)
        return None

    def poll(self, force: bool = False) -> None:
        """Hand over what has landed; `force` copies and waits for the rest (a run's end)."""
        if self._batch and (force or time.perf_counter() - self._batch_started >= MAX_DELAY):
            self._copy_batch()
        if force and self._pending:
            for device in {device for device, _dtype in self._marks}:
                self._torch.cuda.synchronize(device)  # a broken context raises here
        self._hand_over(force)

    def _hand_over(self, force: bool = False) -> None:
        """The values of the copies that have landed, to their callbacks in order; their
        buffers free again."""
        while self._pending:
            host, view, n, dones = self._pending[0]
            if view[n] != 1.0:
                if force:
                    raise RuntimeError("a copy back from the GPU did not land")
                return
            self._pending.popleft()
            values, at = view[:n].tolist(), 0
            self._free.append((host, view))
            for size, done, _lost in dones:
                done(values[at : at + size])
                at += size

    def poll_at_end(self) -> None:
        """Wait for the rest; a GPU context an error broke (a device-side assert) has lost
        them: said in one line, and what can do without them (a step's row, its time and
        phases) is still written, through the submissions' `lost`."""
        try:
            self.poll(force=True)
        except Exception as exc:
            unread = [lost for *_buffer, dones in self._pending for _n, _d, lost in dones]
            unread += [lost for _v, _d, lost in self._batch]
            # Freeing a pinned buffer asks the broken context about its event, and an error
            # thrown there ends the process (std::terminate): they are kept to the exit.
            keep_to_exit((self._pending, self._batch, self._owned, self._marks))
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
