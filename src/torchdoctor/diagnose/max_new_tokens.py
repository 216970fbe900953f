"""`max_new_tokens`: a Hugging Face `generate()` call returned more new tokens than the
`max_new_tokens` it was asked for (TrainCheck's transformers-23723: Whisper's generate()
raised the limit by the length of a prompt before trimming that prompt to fit the context).
Outputs run long: evaluation scores, latency and memory are those of longer answers than asked.

Seen live (telemetry/silent/generation.py): the outermost generate() call of a decoder-only
model, its `max_new_tokens` (the call's, else the generation config's) against the length of
the sequences it returned less the prompt's.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("max_new_tokens")
@dataclasses.dataclass(kw_only=True)
class MaxNewTokensEvidence(Evidence):
    step: int
    site: str | None
    model: str
    max_new_tokens: int
    prompt: int
    length: int
    new_tokens: int


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.max_new_tokens"):
        d = event["data"]
        where = short_site(d.get("site"))
        at = f" at {where}" if where else ""
        model = d.get("model", "the model")
        out.append(
            Diagnosis(
                kind="max_new_tokens",
                severity="warning",
                step=d.get("step"),
                location=where,
                summary=(
                    f"{model}.generate(){at} was asked for at most {d.get('max_new_tokens')} "
                    f"new tokens and returned {d.get('new_tokens')} (a prompt of "
                    f"{d.get('prompt')} tokens, sequences of {d.get('length')}): the limit "
                    "that reached the generation loop is not the one asked for."
                ),
                evidence=MaxNewTokensEvidence.from_json(d),
                fix=[
                    f"look at what {model}.generate() does to `max_new_tokens` before it "
                    "calls the generation loop: a limit raised by the length of a prompt must "
                    "use the prompt as it is fed (after trimming it to the context), not as it "
                    "was passed; upgrade transformers where it is a library model's generate()",
                    "meanwhile, cut the output: sequences[:, prompt_length:][:, :max_new_tokens]",
                ],
                key=f"max_new_tokens:{where}",
            )
        )
    return out
