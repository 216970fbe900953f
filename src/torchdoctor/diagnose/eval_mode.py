"""`eval_mode`: a model trained while in eval mode (model.eval() for a validation pass, never
undone by model.train()): dropout is off, batch-norm layers normalise with their running
statistics and stop updating them.

Seen live (telemetry/silent/modes.py): at backward() on two sampled steps, a model whose
parameters an optimizer holds has `training == False`.
"""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

_WORDS = {
    "dropout": "dropout off",
    "batch_norm": "batch norm on running statistics (not updated)",
    "spectral_norm": "spectral norm's power iteration not run",
    "rrelu": "RReLU's random slopes fixed",
    "functional_dropout": "dropout off",
}
# What a kind counts: modules, except functional dropout (calls such as
# F.dropout(x, p, training=self.training), counted by their lines)
_UNITS = {"functional_dropout": "functional call(s) at {names}"}


@dataclasses.dataclass(kw_only=True)
class ModeModules(Record):
    """The modules of one kind that eval mode changes (dropout, batch_norm, ...): how many,
    and the first few names."""

    count: int
    names: list[str]


@kind("eval_mode")
@dataclasses.dataclass(kw_only=True)
class EvalModeEvidence(Evidence):
    model: str
    step: int
    modules: dict[str, ModeModules]  # by kind
    eval_site: str
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.eval_mode"):
        evidence = EvalModeEvidence.from_json(event["data"])
        model = evidence.model or "the model"
        modules = evidence.modules or {}
        eval_site = short_site(evidence.eval_site)
        where = f", put there by .eval() at {eval_site}" if eval_site else ""
        changed = "; ".join(
            f"{_WORDS.get(kind, kind)} in {_counted(kind, info)}" for kind, info in modules.items()
        )
        if changed:
            summary = (
                f"{model} is trained in eval mode{where}: {changed}. Training runs without "
                f"the {_built_with(modules)} it was built with."
            )
            severity = "warning"
        else:
            summary = (
                f"{model} is trained in eval mode{where}; it has no dropout or batch-norm "
                "layers, and no dropout call was seen turned off in its evaluation, so the "
                "mode changes nothing that was seen."
            )
            severity = "info"
        out.append(
            Diagnosis(
                kind="eval_mode",
                severity=severity,
                step=evidence.step,
                location=eval_site or model,
                summary=summary,
                evidence=evidence,
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


def _counted(kind: str, info: ModeModules) -> str:
    unit = _UNITS.get(kind)
    if unit is None:
        return f"{info.count} module(s)"
    names = ", ".join(short_site(n) or n for n in info.names)
    return f"{info.count} " + unit.format(names=names)


def _built_with(modules: dict[str, ModeModules]) -> str:
    if modules.keys() <= {"dropout", "functional_dropout", "rrelu"}:
        return "regularisation"
    return "regularisation and normalisation"
