"""`scheduler_unused`: a learning-rate scheduler that cannot change the learning rate: it is
bound to an optimizer that never steps (the optimizer was re-created after the scheduler was
built), or it is never stepped at all.

Judged from the schedulers' summaries (telemetry/silent/schedulers.py): bound to an idle
optimizer once the scheduler was stepped twice while others trained; never stepped once two
epochs of the largest DataLoader have passed (or 2,000 updates when no loader has a length).
A scheduler that steps but leaves the rate where it is (ConstantLR after its milestones,
ReduceLROnPlateau without a plateau) is doing its job and not this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

EPOCHS = 2
NO_LENGTH = 2000


@dataclasses.dataclass(kw_only=True)
class SchedulerCalls(Record):
    """A scheduler as telemetry/silent/schedulers.py sums it up: its class, the line that built
    it, how often it was stepped, and whether the optimizer it drives ever stepped (named then)."""

    scheduler: str = "scheduler"
    site: str | None = None
    calls: int = 0
    optimizer_stepped: bool = False
    optimizer: str | None = None


@kind("scheduler_unused")
@dataclasses.dataclass(kw_only=True)
class SchedulerUnusedEvidence(Evidence):
    scheduler: SchedulerCalls
    updates: int
    judged_after: int | None = optional()


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    summaries = [e["data"] for e in inputs.events_of("silent.schedulers")]
    if not summaries:
        return []
    lengths = [e["data"].get("batches") for e in inputs.events_of("dataloader")]
    lengths = [n for n in lengths if isinstance(n, int) and n > 0]
    idle_after = EPOCHS * max(lengths) if lengths else NO_LENGTH
    found: dict[Any, Diagnosis] = {}  # per scheduler, from the first summary that shows it
    for summary in summaries:
        updates = int(summary.get("updates") or 0)  # as many as the summary's counts cover
        for s in map(SchedulerCalls.from_json, summary.get("schedulers") or []):
            where = short_site(s.site)
            if where in found:
                continue
            kind = s.scheduler
            at = f" (built at {where})" if where else ""
            if not s.optimizer_stepped and s.calls >= 2 and updates >= 2:
                found[where] = _orphan(kind, at, where, s, summary, updates)
            elif s.calls == 0 and updates >= idle_after:
                found[where] = _never(kind, at, where, s, summary, updates, idle_after)
    return list(found.values())


def _orphan(
    kind: str, at: str, where: Any, s: SchedulerCalls, latest: dict[str, Any], updates: int
) -> Diagnosis:
    return Diagnosis(
        kind="scheduler_unused",
        severity="warning",
        step=latest.get("step"),
        location=where,
        summary=(
            f"{kind}{at} is stepped ({s.calls} times) but drives an optimizer that never "
            f"steps, while {updates} updates were made by another: the learning rate of the "
            "optimizer that trains never follows the schedule."
        ),
        evidence=SchedulerUnusedEvidence(scheduler=s, updates=updates),
        fix=[
            "build the scheduler from the optimizer that steps (after the optimizer is "
            "re-created, e.g. on resuming or after changing the model, re-create the "
            "scheduler too)",
        ],
        key=f"scheduler_unused:{where}",
    )


def _never(
    kind: str,
    at: str,
    where: Any,
    s: SchedulerCalls,
    latest: dict[str, Any],
    updates: int,
    after: int,
) -> Diagnosis:
    return Diagnosis(
        kind="scheduler_unused",
        severity="warning",
        step=latest.get("step"),
        location=where,
        summary=(
            f"{kind}{at} was never stepped in {updates} updates (over {after} would cover two "
            "epochs): the learning rate stays at its initial value."
        ),
        evidence=SchedulerUnusedEvidence(scheduler=s, updates=updates, judged_after=after),
        fix=[
            "call scheduler.step() once per update (per-step schedules) or once per epoch, "
            "after optimizer.step()",
        ],
        key=f"scheduler_unused:{where}",
    )
