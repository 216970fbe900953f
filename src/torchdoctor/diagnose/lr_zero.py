"""`lr_zero`: the learning rate is exactly 0 for many steps in a row, up to the latest, so the
updates change nothing (a warm-up computed with integer division, a schedule that ended, a
factor of 0). A warm-up that starts at 0 for a step or a few is not this, nor a parameter
group kept at 0 on purpose while others train (said as info).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis

MIN_STEPS = 20


@dataclasses.dataclass(kw_only=True)
class OptimizerRates(Record):
    """An optimizer as telemetry/silent/coverage.py reports it: the name the loop gives it, its
    class, whether it is the primary one and each parameter group's learning rate."""

    optimizer: str | None
    type: str | None
    primary: bool = False
    lrs: list[float | None] = dataclasses.field(default_factory=list)


@kind("lr_zero")
@dataclasses.dataclass(kw_only=True)
class LrZeroEvidence(Evidence):
    first_zero_step: int
    steps: int
    optimizer: OptimizerRates | None = None


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    if inputs.steps.rows < MIN_STEPS:
        return []
    valid = inputs.valid("lr")
    lr = inputs.column("lr")
    if not valid[-1] or lr[-1] != 0:
        return []
    nonzero = np.flatnonzero(~valid | (lr != 0))
    start = int(nonzero[-1]) + 1 if nonzero.size else 0
    run = inputs.steps.rows - start
    if run < MIN_STEPS:
        return []
    steps = inputs.column("step")
    first = int(steps[start])
    last = int(steps[start + MIN_STEPS - 1])  # when the run of zeros became long enough
    facts = inputs.events_of("silent.optimizers")
    optimizers = facts[-1]["data"].get("optimizers", []) if facts else []
    primary = next((OptimizerRates.from_json(o) for o in optimizers if o.get("primary")), None)
    where = primary.optimizer if primary else None
    lrs = primary.lrs if primary else []
    since = "from the first step" if start == 0 else f"since step {first}"
    if any((x or 0) > 0 for x in lrs):
        return [
            Diagnosis(
                kind="lr_zero",
                severity="info",
                step=last,
                location=where,
                summary=(
                    f"The first parameter group's learning rate is 0 {since}; other groups "
                    f"train (learning rates {lrs}): that group is frozen."
                ),
                evidence=LrZeroEvidence(first_zero_step=first, steps=run, optimizer=primary),
                fix=["nothing, if that group is frozen on purpose"],
                key="lr_zero",
            )
        ]
    return [
        Diagnosis(
            kind="lr_zero",
            severity="warning",
            step=last,
            location=where,
            summary=(
                f"The learning rate{' of ' + where if where else ''}"
                f"{' (' + primary.type + ')' if primary and primary.type else ''} is 0 {since} "
                f"({run} steps): updates change nothing, the model does not learn."
            ),
            evidence=LrZeroEvidence(first_zero_step=first, steps=run, optimizer=primary),
            fix=[
                "check the scheduler's factor: integer division (step // warmup) gives 0 "
                "until the warm-up ends; use a float: min(1.0, (step + 1) / warmup)",
                "check that a schedule that decays to 0 is not shorter than the training",
                "check the lr given to the optimizer",
            ],
            key="lr_zero",
        )
    ]
