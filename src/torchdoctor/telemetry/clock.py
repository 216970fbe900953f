"""Timestamps for phases and module calls: perf_counter on CPU, CUDA events on a GPU run.

CUDA events are recorded on the stream and read once a copy queued after them has landed
(telemetry/readback.py), so timing never waits for the device and never asks it anything.
"""

from __future__ import annotations

import time
from typing import Any


class CpuClock:
    cuda = False

    @staticmethod
    def mark() -> float:
        return time.perf_counter()

    @staticmethod
    def elapsed(start: Any, end: Any) -> float:
        return float(end - start)


class CudaClock:
    cuda = True

    def __init__(self, torch: Any) -> None:
        self._event = torch.cuda.Event

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def elapsed(start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0
