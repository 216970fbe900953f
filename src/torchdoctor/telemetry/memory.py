"""Memory readings cheap enough for every step.

CUDA: the caching allocator's allocated / peak / reserved bytes (host-side counters, no device
sync). CPU: there is no allocator counter for CPU tensors, so `allocated` is the resident set
size, the best honest reading available, and the peak is the process's peak RSS.
"""

from __future__ import annotations

import os
import resource
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PEAK_EVERY = 8


class MemoryReader:
    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._reads = 0
        self._peak = 0
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None

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

    def read(self) -> tuple[int, int, int, int]:
        """(allocated, max_allocated, reserved, rss) in bytes."""
        rss = self.rss()
        if self.on_cuda():
            stats = self._torch.cuda.memory_stats()
            return (
                int(stats.get("allocated_bytes.all.current", 0)),
                int(stats.get("allocated_bytes.all.peak", 0)),
                int(stats.get("reserved_bytes.all.current", 0)),
                rss,
            )
        self._reads += 1
        if self._reads % _PEAK_EVERY == 1:  # a syscall: every few steps is enough for a peak
            self._peak = max(self._peak, self.peak_rss())
        self._peak = max(self._peak, rss)
        return rss, self._peak, rss, rss

    def allocated(self) -> tuple[int, int]:
        """(allocated, max_allocated): the figures per module call in torch_trace."""
        if self.on_cuda():
            cuda = self._torch.cuda
            return int(cuda.memory_allocated()), int(cuda.max_memory_allocated())
        rss = self.rss()
        return rss, max(rss, self.peak_rss())

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
