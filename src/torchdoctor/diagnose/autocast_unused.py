"""`autocast_unused`: mixed precision that is not applied: autocast turned on for another
device type than the model's (`torch.autocast("cuda")` around a CPU model: no effect), or on
for the model's device while every matmul and convolution of the loss's graph still ran in
float32 (an op path autocast does not cover).

Seen live (telemetry/silent/loss_graph.py): the autocast state at the model call against the
model's device; the dtypes the graph's matmul and convolution nodes saved.
"""

from __future__ import annotations

import dataclasses

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("autocast_unused")
@dataclasses.dataclass(kw_only=True)
class AutocastUnusedEvidence(Evidence):
    problem: str
    ops: int
    autocast: list[list[str]]  # [device type, dtype] pairs in force
    step: int
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.autocast_unused"):
        d = event["data"]
        where = short_site(d.get("site"))
        enabled = ", ".join(f"{dev} ({dt})" for dev, dt in d.get("autocast") or [])
        if d.get("problem") == "device":
            device = d.get("model_device")
            summary = (
                f"autocast is on for {enabled}, but {d.get('model', 'the model')} runs on "
                f"{device}: autocast does nothing there, and the model trains in full "
                "precision."
            )
            fix = [
                f"use torch.autocast(device_type='{device}', ...) (the device type of the "
                "model's tensors)",
            ]
            key = "autocast_unused:device"
        else:
            summary = (
                f"autocast is on ({enabled}), yet all {d.get('ops')} matmuls and convolutions "
                "of the loss's graph ran in float32: mixed precision is not applied."
            )
            fix = [
                "run the forward pass inside the autocast region (not only the loss)",
                "check for layers that disable autocast or call ops autocast does not cover",
            ]
            key = "autocast_unused:float32"
        out.append(
            Diagnosis(
                kind="autocast_unused",
                severity="warning",
                step=d.get("step"),
                location=where,
                summary=summary,
                evidence=AutocastUnusedEvidence.from_json(d),
                fix=fix,
                key=key,
            )
        )
    return out
