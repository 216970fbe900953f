"""`accumulation`: gradient accumulation that scales wrongly: micro-batch losses summed without
dividing by their number, divided by a number other than the micro-batches per update, or
gradients cleared before every micro-batch so that only the last one counts.

How it is told (telemetry/silent/loss_graph.py, grad_reset.py): an update preceded by k
backward() calls on k batches fetched is an accumulation of k micro-batches; the root of each
loss's autograd graph shows whether and by what constant it was divided; the probe gradients
show whether only the last micro-batch's gradient reached the update.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("accumulation")
@dataclasses.dataclass(kw_only=True)
class AccumulationEvidence(Evidence):
    problem: str
    divisor: float | None = None  # what each loss was divided by (None: not divided)
    micro_batches: int
    fetches: int
    step: int
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.accumulation"):
        d = event["data"]
        problem = d.get("problem")
        k = d.get("micro_batches")
        where = short_site(d.get("site"))
        summary, fix = _words(problem, k, d)
        out.append(
            Diagnosis(
                kind="accumulation",
                severity="warning",
                step=d.get("step"),
                location=where,
                summary=summary,
                evidence=AccumulationEvidence.from_json(d),
                fix=fix,
                key=f"accumulation:{problem}",
            )
        )
    return out


def _words(problem: Any, k: Any, d: dict[str, Any]) -> tuple[str, list[str]]:
    if problem == "not_divided":
        return (
            f"Gradient accumulation without division: each update sums {k} micro-batches' "
            f"gradients (one backward() per batch fetched) and the losses are not divided by "
            f"{k}, so the update is {k} times what one batch of the combined size would give "
            f"(the learning rate is effectively {k}x).",
            [
                f"divide each micro-batch's loss by {k} before backward(): (loss / {k}).backward()",
                f"or lower the learning rate {k}x if the summed gradient is intended",
            ],
        )
    if problem == "divided_by":
        n = d.get("divisor")
        return (
            f"Gradient accumulation divides each micro-batch's loss by {n}, but {k} "
            f"micro-batches make each update (one backward() per batch fetched): the update "
            f"is {k}/{n} of the intended size.",
            [
                f"divide by the number of backward() calls per optimizer.step(): {k} here "
                "(check the accumulation counter and the condition that calls step())",
            ],
        )
    return (
        f"Gradients are cleared before every micro-batch: of the {k} backward() calls "
        f"before each update, only the last one's gradient reaches optimizer.step() (the "
        f"gradients at the update are exactly the last micro-batch's).",
        [
            "call optimizer.zero_grad() after optimizer.step() (once per update), not inside "
            "the micro-batch loop",
        ],
    )
