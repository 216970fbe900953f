"""Memory readings for the step rows, taken off the training thread.

CUDA: the caching allocator's allocated / peak / reserved bytes (host-side counters, no device
sync). CPU: there is no allocator counter for CPU tensors, so `allocated` is the resident set
size, the best honest reading available, and the peak is the process's peak RSS.

A sampler thread reads them ten times a second; a step row takes the latest sample, so the
training thread makes no system call for memory. Traced steps and OOM analysis read
synchronously (`read_now`).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
INTERVAL = 0.1


class MemoryReader:
    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.device: int | None = None  # the training thread's CUDA device, once known
        self.gpu: bool | None = None  # the steps run on a GPU (None: not known before one ends)
        # the sampler thread's last reading (the steady step reads it too: native/steady.cpp)
        self.latest: tuple[int, int, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None

    # -- readings ----------------------------------------------------------------------------
    def rss(self) -> int:
        if self._statm is not None:
            try:
                return int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return self.peak_rss()

    @staticmethod
    def peak_rss() -> int:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def on_cuda(self) -> bool:
        # is_initialized() is a flag read; is_available() would ask the driver every time.
        return bool(self._torch.cuda.is_initialized())

    def settle(self, ran_on_gpu: bool) -> bool:
        """The first step has ended: the run's figures are the GPU allocator's when that step
        ran on a GPU, else the process's (a CPU model in a process that touched CUDA)."""
        self.gpu = ran_on_gpu and self.on_cuda()
        if self.gpu:
            self.device = self._torch.cuda.current_device()
        return self.gpu

    def _on_gpu(self) -> bool:
        return self.gpu if self.gpu is not None else self.on_cuda()

    def read_now(self) -> tuple[int, int, int, int]:
        """(allocated, max_allocated, reserved, rss) in bytes, read now."""
        rss = self.rss()
        if self._on_gpu():
            return (*self._cuda_figures(), rss)
        return rss, max(rss, self.peak_rss()), rss, rss

    def _cuda_figures(self) -> tuple[int, int, int]:
        """(allocated, peak allocated, reserved) of the GPU, in one call: the allocator's
        nested statistics read directly, since memory_stats() flattens all of them in Python
        (about 400 calls, 0.4 ms on an H100 machine's CPU) and memory_allocated() and
        max_memory_allocated() each call it."""
        cuda = self._torch.cuda
        device = self.device if self.device is not None else cuda.current_device()
        raw = getattr(self._torch._C, "_cuda_memoryStats", None)
        if raw is not None:
            try:
                stats = raw(device)
                used = stats["allocated_bytes"]["all"]
                reserved = stats["reserved_bytes"]["all"]["current"]
                return int(used["current"]), int(used["peak"]), int(reserved)
            except (KeyError, TypeError, RuntimeError):
                pass
        flat = cuda.memory_stats(device)
        return (
            int(flat.get("allocated_bytes.all.current", 0)),
            int(flat.get("allocated_bytes.all.peak", 0)),
            int(flat.get("reserved_bytes.all.current", 0)),
        )

    def row(self, step: int, phase: str, rank: int) -> tuple[Any, ...]:
        """A python.memory row: the figures now, at a phase boundary of a traced step."""
        allocated, peak, reserved, _rss = self.read_now()
        return (step, phase, allocated, peak, reserved, time.time(), rank)

    def read(self) -> tuple[int, int, int, int]:
        """The latest sample (at most INTERVAL old), or a reading now if there is none yet."""
        latest = self.latest
        return latest if latest is not None else self.read_now()

    def allocated(self) -> tuple[int, int]:
        """(allocated, max_allocated) now: the figures per module call in torch_trace."""
        if self._on_gpu():
            allocated, peak, _reserved = self._cuda_figures()
            return allocated, peak
        rss = self.rss()
        return rss, max(rss, self.peak_rss())

    # -- the sampler -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self.latest = self.read_now()
            self._thread = threading.Thread(
                target=self._loop, name="torchdoctor-memory", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            try:
                self.latest = self.read_now()
            except Exception:
                self.latest = None  # readings fall back to the training thread
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
