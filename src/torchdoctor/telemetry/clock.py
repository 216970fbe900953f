"""Timestamps for phases and module calls: perf_counter on CPU, CUDA events on a GPU run.

CUDA events are recorded on the stream and read back once they have completed, so timing
never waits for the device (no host-device sync in the hot path).
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

    @staticmethod
    def ready(marks: list[Any]) -> bool:
        return True


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

    @staticmethod
    def ready(marks: list[Any]) -> bool:
        return all(m.query() for m in marks if m is not None)
