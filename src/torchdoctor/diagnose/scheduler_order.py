"""`scheduler_order`: lr_scheduler.step() called before the optimizer's first step() (the
order before PyTorch 1.1): the schedule's first value is skipped and every later one comes a
step (or epoch) early.

Seen live (telemetry/silent/schedulers.py): the scheduler's first step() after its
construction comes while its optimizer has not stepped, and no GradScaler skip explains it.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("scheduler_order")
@dataclasses.dataclass(kw_only=True)
class SchedulerOrderEvidence(Evidence):
    scheduler: str
    site: str
    created: str
    step: int
    updates: int


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.scheduler_order"):
        d = event["data"]
        where = short_site(d.get("site"))
        kind = d.get("scheduler", "the scheduler")
        at = f" at {where}" if where else ""
        out.append(
            Diagnosis(
                kind="scheduler_order",
                severity="warning",
                step=d.get("step"),
                location=where,
                summary=(
                    f"{kind}.step(){at} runs before its optimizer's first step(): the "
                    "schedule's first learning rate is skipped, and every later one comes "
                    "one call early."
                ),
                evidence=SchedulerOrderEvidence.from_json(d),
                fix=[
                    "call scheduler.step() after optimizer.step(): at the end of the step "
                    "(per-step schedules) or at the end of the epoch (per-epoch ones)",
                ],
                key=f"scheduler_order:{where}",
            )
        )
    return out
