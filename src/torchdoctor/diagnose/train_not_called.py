"""`train_not_called`: a module class overrides train() (to freeze stages, to keep batch-norm
layers in eval mode) and the training loop never called model.train(), so what the override
does was never done: the layers it freezes are trained.

Seen live (telemetry/silent/modes.py): nn.Module.train is watched; at the first sampled step,
a module whose class overrides train() has not been reached by any train() or eval() call.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("train_not_called")
@dataclasses.dataclass(kw_only=True)
class TrainNotCalledEvidence(Evidence):
    model: str
    step: int
    modules: list[dict[str, str | None]]  # module, class, override (file:line of its train())
    count: int


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.train_not_called"):
        d = event["data"]
        model = d.get("model", "the model")
        modules = d.get("modules") or [{}]
        first = modules[0]
        override = short_site(first.get("override"))
        names = ", ".join(f"{m.get('module')} ({m.get('class')})" for m in modules[:3])
        more = f" and {d.get('count', 0) - 3} more" if d.get("count", 0) > 3 else ""
        at = f" (at {override})" if override else ""
        out.append(
            Diagnosis(
                kind="train_not_called",
                severity="warning",
                step=d.get("step"),
                location=first.get("module") or model,
                summary=(
                    f"{model}.train() was never called, but {names}{more} override train()"
                    f"{at}: what the override does when training starts (freezing stages, "
                    "keeping normalisation layers in eval mode) never happened, and the "
                    "model trains as constructed."
                ),
                evidence=TrainNotCalledEvidence.from_json(d),
                fix=[
                    f"call {model}.train() before the training loop (and after each "
                    "validation pass)",
                    "or apply the freezing in the model's constructor, so it holds without train()",
                ],
                key=f"train_not_called:{model}",
            )
        )
    return out
