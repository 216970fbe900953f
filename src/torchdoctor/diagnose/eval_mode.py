"""`eval_mode`: a model trained while in eval mode (model.eval() for a validation pass, never
undone by model.train()): dropout is off, batch-norm layers normalise with their running
statistics and stop updating them.

Seen live (telemetry/silent/modes.py): at backward() on two sampled steps, a model whose
parameters an optimizer holds has `training == False`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

_WORDS = {
    "dropout": "dropout off",
    "batch_norm": "batch norm on running statistics (not updated)",
    "spectral_norm": "spectral norm's power iteration not run",
    "rrelu": "RReLU's random slopes fixed",
}


@kind("eval_mode")
@dataclasses.dataclass(kw_only=True)
class EvalModeEvidence(Evidence):
    model: str
    step: int
    modules: dict[str, Any]
    eval_site: str
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.eval_mode"):
        d = event["data"]
        model = d.get("model", "the model")
        modules: dict[str, Any] = d.get("modules") or {}
        eval_site = short_site(d.get("eval_site"))
        where = f", put there by .eval() at {eval_site}" if eval_site else ""
        changed = "; ".join(
            f"{_WORDS.get(kind, kind)} in {info.get('count')} module(s)"
            for kind, info in modules.items()
        )
        if changed:
            summary = (
                f"{model} is trained in eval mode{where}: {changed}. Training runs without "
                "the regularisation and normalisation it was built with."
            )
            severity = "warning"
        else:
            summary = (
                f"{model} is trained in eval mode{where}; it has no dropout or batch-norm "
                "layers, so the mode changes nothing yet."
            )
            severity = "info"
        out.append(
            Diagnosis(
                kind="eval_mode",
                severity=severity,
                step=d.get("step"),
                location=eval_site or model,
                summary=summary,
                evidence=EvalModeEvidence.from_json(d),
                fix=[
                    f"call {model}.train() before the training steps (at the start of each "
                    "epoch, and after every validation pass that called .eval())",
                    "to keep batch-norm statistics frozen on purpose, put only those layers in "
                    "eval mode (module.eval() on each), not the whole model",
                ],
                key=f"eval_mode:{model}",
            )
        )
    return out
