"""`batch_collapsed`: the DataLoader is asked for batches of B > 1 samples, yet every tensor
the model gets has a leading dimension of 1 on every sampled step: the batch was merged into
one sample on the way (a collate function or processor that nests the batch in a list).

Seen live (telemetry/silent/batches.py): the leading dimensions of the first model call's
tensors, against the batch_size of the DataLoaders seen.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis

MIN_STEPS = 3


@kind("batch_collapsed")
@dataclasses.dataclass(kw_only=True)
class BatchCollapsedEvidence(Evidence):
    batch_sizes: list[int]
    shapes: list[list[int]]  # the last step's input shapes
    steps: list[int]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    windows = [e["data"] for e in inputs.events_of("silent.batches")]
    leads = [lead for w in windows for lead in w.get("lead") or []]
    if len(leads) < MIN_STEPS or not all(lead and all(x == 1 for x in lead) for lead in leads):
        return []
    sizes = [e["data"].get("batch_size") for e in inputs.events_of("dataloader")]
    sizes = [s for s in sizes if isinstance(s, int)]
    if not sizes or min(sizes) < 2:
        return []
    last = windows[-1]
    model = last.get("model", "the model")
    steps = [s for w in windows for s in w.get("steps") or []]
    return [
        Diagnosis(
            kind="batch_collapsed",
            severity="warning",
            step=max(steps) if steps else None,
            location=model,
            summary=(
                f"The DataLoader batches {min(sizes)} samples, but {model} gets tensors "
                f"{[tuple(s) for s in last.get('shapes') or []]} with a batch dimension of 1 "
                f"on every sampled step ({len(leads)}): the batch is lost on the way (a "
                "collate function or processor merged it into one sample)."
            ),
            evidence=BatchCollapsedEvidence(
                batch_sizes=sizes, shapes=last.get("shapes"), steps=steps
            ),
            fix=[
                "check the collate_fn / processor output: it must stack the samples along "
                "dimension 0 (pass lists of samples, not a list holding the batch)",
            ],
            key="batch_collapsed",
        )
    ]
