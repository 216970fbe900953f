"""What every diagnosis module reads: table snapshots and events, nothing live."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from torchdoctor.store.columns import Block


@dataclasses.dataclass
class HangCapture:
    """What the hang watchdog saw when no step came for the hang timeout (the `hang`
    diagnosis classifies it)."""

    seconds: float  # since the last step (or the start)
    timeout: float  # the timeout in force
    steps: int  # steps done so far
    threads: list[dict[str, Any]]  # every thread's stack (telemetry.stacks.capture_all)


@dataclasses.dataclass
class Inputs:
    steps: Block  # python.steps, oldest first
    module_grads: Block  # python.module_grads
    events: list[dict[str, Any]]  # python.events rows, `data` decoded
    config: Any  # the run's Config (hang_timeout, guard, ...)
    now: float  # wall-clock time of this pass
    last_step_time: float | None = None  # wall-clock time of the last step, if any
    hang: HangCapture | None = None  # the watchdog's capture when no step came for long
    compile: Block | None = None  # python.compile: torch.compile events

    @classmethod
    def of(
        cls,
        block: Callable[[str], Block],
        config: Any,
        now: float | None = None,
        hang: HangCapture | None = None,
    ) -> Inputs:
        """The inputs from a source of table snapshots: a live run's tables, or a saved run
        (`block(name)` gives a table). `now` defaults to the time of the last step: a saved
        run is judged as it stood when it ended."""
        steps = block("steps")
        last = float(steps.data["time"][-1]) if steps.rows else None
        return cls(
            steps=steps,
            module_grads=block("module_grads"),
            events=decode_events(block("events")),
            config=config,
            now=now if now is not None else (last or 0.0),
            last_step_time=last,
            hang=hang,
            compile=block("compile"),
        )

    def column(self, name: str) -> np.ndarray:
        return self.steps.data[name]

    def valid(self, name: str) -> np.ndarray:
        """Mask of rows where a nullable steps column has a value."""
        mask = self.steps.nulls.get(name)
        return np.ones(self.steps.rows, dtype=bool) if mask is None else ~mask

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]


def decode_events(block: Block) -> list[dict[str, Any]]:
    out = []
    for record in block.to_records():
        try:
            record["data"] = json.loads(record.get("data") or "{}")
        except ValueError:
            record["data"] = {}
        out.append(record)
    return out
