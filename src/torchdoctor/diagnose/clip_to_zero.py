"""`clip_to_zero`: gradient clipping with a threshold of 0 (`clip_grad_value_(params, 0.0)`,
`clip_grad_norm_(params, max_norm=0)`, Lightning's `clip_gradients(..., clip_val=0.0)`): every
gradient is set to 0 before the update, so no weight ever moves. A threshold has no use at 0;
it is a typo, or a config value that came through as 0.

Seen live (telemetry/torch_hooks.py): the clip functions are wrapped; the first call of each
with a threshold of exactly 0 is an event, with the user's line that made it.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

EVENT = "clip_to_zero"
_ARGUMENT = {"clip_grad_value_": "clip_value", "clip_grad_norm_": "max_norm"}


@kind("clip_to_zero")
@dataclasses.dataclass(kw_only=True)
class ClipToZeroEvidence(Evidence):
    function: str  # clip_grad_value_ or clip_grad_norm_
    threshold: float
    site: str | None = None


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of(EVENT):
        evidence = ClipToZeroEvidence.from_json(event["data"])
        where = short_site(evidence.site)
        at = f" at {where}" if where else ""
        argument = _ARGUMENT.get(evidence.function, "threshold")
        out.append(
            Diagnosis(
                kind="clip_to_zero",
                severity="error",
                step=event.get("step"),
                location=where,
                summary=(
                    f"Gradients are clipped with {evidence.function}({argument}=0){at}: every "
                    "gradient is 0 when the optimizer reads it, so no update moves a weight."
                ),
                evidence=evidence,
                fix=[
                    f"give the clip a positive {argument} (1.0 or 0.25 are usual; 0 zeroes "
                    "every gradient), or leave clipping out",
                ],
                key=f"clip_to_zero:{evidence.function}",
            )
        )
    return out
