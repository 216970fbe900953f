"""The largest batch size that fits, measured: double until a try fails, then bisect.

`find_max_batch_size(step_fn, ...)` calls `step_fn(batch_size)`, which runs one full training
step (forward, backward, optimizer step) on a batch of that size. A try fails when it raises
an out-of-memory error (CUDA or CPU), or when its peak memory goes over `max_memory`. Between
tries everything the try left is released (gradients set to None, the garbage collector, the
CUDA cache, the C heap's free pages), so each try starts from the same memory.

Peak memory of a try is measured above what was in use when it began: on CUDA the allocator's
peak (`torch.cuda.reset_peak_memory_stats` / `max_memory_allocated`); on CPU the peak resident
set size (the kernel's high-water mark, reset through /proc/self/clear_refs; a 1 ms sampler
where that is not allowed). Memory per sample is the slope of peak against batch size over the
tries that fitted.

On CPU without `max_memory`, the budget is 90% of the memory available when the search starts,
so that the search itself never wakes the kernel's OOM killer. The tries train the model: run
the search on a copy, or reload the weights afterwards.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from torchdoctor.errors.oom_message import is_oom
from torchdoctor.memory.host import available, status_fields
from torchdoctor.units import human


@dataclasses.dataclass
class Try:
    batch_size: int
    ok: bool
    peak: int | None  # bytes above what was in use before the try
    seconds: float
    error: str | None = None  # why it failed: the OOM message, or "over max_memory"


@dataclasses.dataclass
class BatchSizeResult:
    max_batch_size: int  # 0 when even the first size failed
    first_failure: int | None  # the smallest size that failed (None: never failed)
    memory_per_sample: float | None  # bytes, slope of peak memory against batch size
    base_memory: float | None  # bytes, the intercept: what a try takes besides the batch
    device: str
    max_memory: int | None
    limit_reached: bool
    tries: list[Try]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return summary(self)


def summary(result: BatchSizeResult) -> str:
    if result.max_batch_size == 0:
        size = result.first_failure
        return f"no batch size fits: even {size} failed on {result.device}"
    text = f"largest batch size that fits on {result.device}: {result.max_batch_size}"
    if result.first_failure is not None:
        text += f" ({result.first_failure} failed)"
    elif result.limit_reached:
        text += " (the limit; larger sizes were not tried)"
    if result.memory_per_sample:
        text += f"; memory per sample ≈ {human(result.memory_per_sample)}"
    return text


def malloc_trim() -> None:
    """Give the C heap's free pages back to the system (glibc), so RSS starts low."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def fit_line(points: list[tuple[int, int]]) -> tuple[float | None, float | None]:
    """Least-squares (slope, intercept) of peak against batch size."""
    if not points:
        return None, None
    if len(points) == 1 or len({x for x, _ in points}) == 1:
        x, y = points[0]
        return (y / x if x else None), 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    return slope, my - slope * mx


# -- peak memory ---------------------------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    return status_fields().get(field)


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def available_memory() -> int | None:
    return available()


class _CpuPeak:
    """Peak RSS above the RSS at the start, for one try."""

    def __init__(self) -> None:
        self.before = 0
        self._hwm = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._max = 0

    def __enter__(self) -> _CpuPeak:
        self.before = _status_kib("VmRSS") or 0
        self._hwm = _reset_hwm() and _status_kib("VmHWM") is not None
        if not self._hwm:
            self._max = self.before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._max = max(self._max, _status_kib("VmRSS") or 0)

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    @property
    def peak(self) -> int:
        top = (_status_kib("VmHWM") or 0) if self._hwm else self._max
        return max(0, top - self.before)


class _CudaPeak:
    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.before = 0
        self.peak = 0

    def __enter__(self) -> _CudaPeak:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        self.before = int(cuda.memory_allocated(self.device))
        cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        cuda = self.torch.cuda
        try:
            cuda.synchronize(self.device)
        except Exception:
            pass
        self.peak = max(0, int(cuda.max_memory_allocated(self.device)) - self.before)


# -- the search ------------------------------------------------------------------------------------
def search(
    attempt: Callable[[int], bool],
    start: int,
    limit: int | None = None,
    known_bad: int | None = None,
) -> tuple[int, int | None]:
    """(largest size that worked, smallest that failed or None): `attempt(size)` from `start`,
    doubling up to `limit` until one fails, then bisecting between the last good and the
    first bad size."""
    good, bad = 0, known_bad
    size = start
    while bad is None:
        if attempt(size):
            good = size
            if limit is not None and size >= limit:
                break
            size = size * 2 if limit is None else min(size * 2, limit)
        else:
            bad = size
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, bad


def _device_of(torch: Any, device: Any, model: Any) -> Any:
    if device is not None:
        return torch.device(device)
    if model is not None:
        try:
            return next(model.parameters()).device
        except StopIteration:
            pass
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def find_max_batch_size(
    step_fn: Callable[[int], Any],
    start: int = 1,
    limit: int | None = None,
    device: Any = None,
    max_memory: int | None = None,
    *,
    model: Any = None,
    optimizer: Any = None,
    cleanup: Callable[[], Any] | None = None,
    warmup: bool = True,
    progress: Callable[[Try], Any] | None = None,
) -> BatchSizeResult:
    """Measure the largest batch size for which `step_fn(batch_size)` runs one training step
    without running out of memory (and, with `max_memory`, without its peak going over it).

    start: the first size tried; limit: the largest size tried; device: where the step runs
    (default: the model's device, else CUDA when available); model / optimizer: their
    gradients are set to None between tries; cleanup: your own clean-up between tries;
    warmup: run `start` once before measuring (the first step allocates the optimizer state
    and warms caches, which would skew the first try); progress: called with each Try."""
    import torch

    if start < 1:
        raise ValueError("start must be >= 1")
    if limit is not None and limit < start:
        raise ValueError("limit must be >= start")
    dev = _device_of(torch, device, model)
    on_cuda = dev.type == "cuda"
    if max_memory is None and not on_cuda:
        free = available_memory()
        max_memory = int(free * 0.9) if free else None
    tries: list[Try] = []

    def clean() -> None:
        for owner in (optimizer, model):
            if owner is not None:
                try:
                    owner.zero_grad(set_to_none=True)
                except Exception:
                    pass
        if cleanup is not None:
            cleanup()
        gc.collect()
        if on_cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
        else:
            malloc_trim()

    def attempt(batch: int, record: bool = True) -> bool:
        clean()
        meter: Any = _CudaPeak(torch, dev) if on_cuda else _CpuPeak()
        error = None
        t0 = time.perf_counter()
        try:
            with meter:
                step_fn(batch)
        except Exception as exc:
            if not is_oom(exc):
                clean()
                raise
            error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "OOM"
        seconds = time.perf_counter() - t0
        peak = meter.peak if error is None else None
        if error is None and max_memory is not None and peak is not None and peak > max_memory:
            error = f"peak {human(peak)} over max_memory {human(max_memory)}"
        outcome = Try(batch, error is None, peak, seconds, error)
        if record:
            tries.append(outcome)
            if progress is not None:
                progress(outcome)
        return outcome.ok

    if warmup and not attempt(start, record=False):
        tries.append(Try(start, False, None, 0.0, "out of memory in the warm-up step"))
        if progress is not None:
            progress(tries[-1])
        good, bad = search(attempt, start, limit, known_bad=start)
    else:
        good, bad = search(attempt, start, limit)
    clean()
    points = [(t.batch_size, t.peak) for t in tries if t.ok and t.peak is not None]
    slope, intercept = fit_line(points)
    return BatchSizeResult(
        max_batch_size=good,
        first_failure=bad,
        memory_per_sample=slope,
        base_memory=intercept,
        device=str(dev),
        max_memory=max_memory,
        limit_reached=bad is None,
        tries=tries,
    )
