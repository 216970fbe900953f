"""`dropout_in_eval`: a model in eval mode still applies dropout: a module calls a functional
dropout with training=True, or scaled_dot_product_attention with dropout_p > 0, instead of
passing `self.training` (outputs change from call to call, and evaluation is noisier and
worse than the model is).

Seen live (telemetry/silent/modes.py): the first calls of a model in eval mode run under a
TorchFunctionMode that looks at the dropout arguments of every functional call.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("dropout_in_eval")
@dataclasses.dataclass(kw_only=True)
class DropoutInEvalEvidence(Evidence):
    model: str
    op: str
    p: float
    site: str
    step: int


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.dropout_in_eval"):
        d = event["data"]
        where = short_site(d.get("site"))
        op = d.get("op", "dropout")
        arg = "dropout_p" if "attention" in str(op) else "training"
        out.append(
            Diagnosis(
                kind="dropout_in_eval",
                severity="warning",
                step=d.get("step"),
                location=where,
                summary=(
                    f"{d.get('model', 'The model')} is in eval mode, yet {op} runs with "
                    f"p={d.get('p')}"
                    f"{' at ' + where if where else ''}: dropout stays on in evaluation, so "
                    "outputs vary from call to call and evaluation is worse than the model."
                ),
                evidence=DropoutInEvalEvidence.from_json(d),
                fix=[
                    f"pass the module's mode: {op}(..., {arg}="
                    + (
                        "self.dropout if self.training else 0.0"
                        if arg == "dropout_p"
                        else "self.training"
                    )
                    + ")",
                    "or use an nn.Dropout submodule, which follows train()/eval() itself",
                    "ignore this if Monte Carlo dropout at evaluation is intended",
                ],
                key=f"dropout_in_eval:{where}",
            )
        )
    return out
