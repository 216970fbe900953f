"""`memory_leak`: memory that grows step after step beyond warm-up, with the growth rate and,
where it can be found, what holds it (a list keeping loss tensors and their graphs alive)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.series import slope
from torchdoctor.memory.holders import Holder
from torchdoctor.units import human

# Its findings describe the run as it stands (the recent steps' memory):
# one it no longer returns has stopped being true, and the doctor marks it resolved.
RESOLVES = True

WARMUP = 10
MIN_STEPS = 30
WINDOW = 400
MIN_GROWTH = 16 * 2**20  # bytes over the window: below this RSS noise dominates
MIN_FRACTION = 0.03  # and at least this fraction of the memory in use
MIN_R2 = 0.9


@kind("memory_leak")
@dataclasses.dataclass(kw_only=True)
class MemoryLeakEvidence(Evidence):
    bytes_per_step: float
    growth: float
    from_step: int
    to_step: int
    start_bytes: float
    end_bytes: float
    r2: float
    holders: list[Holder] | None = optional()  # what holds it (found live)


def detect(inputs: Inputs) -> dict[str, Any] | None:
    """The growth, if memory climbs steadily: bytes per step, total, fit quality."""
    if inputs.steps.rows < WARMUP + MIN_STEPS:
        return None
    steps = inputs.column("step")[WARMUP:][-WINDOW:].astype(float)
    memory = inputs.column("allocated")[WARMUP:][-WINDOW:].astype(float)
    rate, r2 = slope(steps, memory)
    growth = rate * (steps[-1] - steps[0])
    if rate <= 0 or r2 < MIN_R2 or growth < max(MIN_GROWTH, MIN_FRACTION * memory[0]):
        return None
    # Still climbing in the last quarter: not a warm-up that has levelled off.
    quarter = max(5, steps.size // 4)
    late_rate, _ = slope(steps[-quarter:], memory[-quarter:])
    if late_rate < 0.5 * rate:
        return None
    return {
        "bytes_per_step": rate,
        "growth": growth,
        "from_step": int(steps[0]),
        "to_step": int(steps[-1]),
        "start_bytes": float(memory[0]),
        "end_bytes": float(memory[-1]),
        "r2": r2,
    }


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    found = detect(inputs)
    if found is None:
        return []
    return [
        Diagnosis(
            kind="memory_leak",
            severity="warning",
            step=found["to_step"],
            summary=(
                f"Memory grows by {human(found['bytes_per_step'])} per step "
                f"({human(found['growth'])} from step {found['from_step']} to "
                f"{found['to_step']}, steadily): something keeps each step's tensors alive."
            ),
            evidence=MemoryLeakEvidence.from_json(found),
            fix=_FIXES,
            key="memory_leak",
        )
    ]


def with_holders(diagnosis: Diagnosis, holders: list[Holder]) -> Diagnosis:
    """The same diagnosis, naming what holds the memory (found live by the doctor)."""
    if not holders:
        return diagnosis
    top = holders[0]
    name = top.holder
    graphs = top.with_grad_fn
    detail = f"{top.type} {name} holds {top.tensors} tensors"
    if graphs:
        detail += f", {graphs} of them with a grad_fn (each keeps its step's graph alive)"
    diagnosis.location = name
    diagnosis.summary += f" {detail}."
    if isinstance(diagnosis.evidence, MemoryLeakEvidence):
        diagnosis.evidence = dataclasses.replace(diagnosis.evidence, holders=holders)
    fix = f"store plain numbers in {name}: loss.item() (or tensor.detach()) instead of the tensor"
    if not graphs:
        fix = f"bound or clear {name}: it grows every step"
    diagnosis.fix = [fix, *diagnosis.fix]
    return diagnosis


_FIXES = [
    "do not keep tensors across steps: append loss.item(), not loss (a loss tensor keeps its "
    "whole graph alive)",
    "detach what you keep for logging or metrics: x.detach().cpu()",
    "run evaluation under torch.no_grad() or torch.inference_mode()",
    "check caches and lists that grow every step (hooks appending outputs, metric buffers)",
]
