"""`repeated_init`: weights initialised again by the code that had initialised them, before the
first update: `post_init()` / `init_weights()` run once per nested model class (TrainCheck's
transformers-17877), a `reset_parameters()` loop run twice. The weights end up right; the start
is slower and the work wasted.

Seen live (telemetry/silent/inits.py): the outermost `torch.nn.init` calls made outside torch,
per tensor and per line; a tensor initialised twice from one line. Two different lines (a
scaled re-initialisation after `apply(_init_weights)`) are left alone.
"""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@dataclasses.dataclass(kw_only=True)
class InitSite(Record):
    """A line that initialised the same tensors again: the user's line that reached it, how
    many tensors (the first few named) and how many times at most."""

    site: str | None = None
    caller: str | None = None
    tensors: int = 0
    names: list[str] = dataclasses.field(default_factory=list)
    times: int = 0


@kind("repeated_init")
@dataclasses.dataclass(kw_only=True)
class RepeatedInitEvidence(Evidence):
    step: int
    site: str
    names: list[str]
    times: int
    tensors: int
    seconds: float
    sites: list[InitSite]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.repeated_init"):
        evidence = RepeatedInitEvidence.from_json(event["data"])
        sites = evidence.sites or [InitSite()]
        first = sites[0]
        where = short_site(evidence.site)
        names = first.names
        more = first.tensors - len(names)
        named = ", ".join(f"`{n}`" for n in names) + (f" and {more} more" if more > 0 else "")
        others = f" (and from {len(sites) - 1} other lines)" if len(sites) > 1 else ""
        caller = short_site(first.caller)
        via = f", reached from {caller}" if caller and caller != where else ""
        ms = 1000 * float(evidence.seconds or 0.0)
        out.append(
            Diagnosis(
                kind="repeated_init",
                severity="warning",
                step=evidence.step,
                location=where,
                summary=(
                    f"{first.tensors} tensors ({named}) were initialised again by "
                    f"the line that had initialised them, {where}{via}{others} (up to "
                    f"{first.times} times in all), before the first update: the same "
                    "initialisation run again "
                    f"over the same weights ({ms:.1f} ms of repeated work here; it grows with "
                    "the model). The weights end up right; the start is slower."
                ),
                evidence=evidence,
                fix=[
                    "initialise each module once: mark what is initialised (a flag per "
                    "module, as transformers' `_is_hf_initialized`) and skip it, or call "
                    "init_weights() / post_init() only from the outermost model, not from "
                    "each nested model class",
                ],
                key=f"repeated_init:{where}",
            )
        )
    return out
