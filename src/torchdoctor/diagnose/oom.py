"""`oom`: an allocation failed (CUDA `torch.OutOfMemoryError`, CPU "DefaultCPUAllocator: can't
allocate memory").

Event-driven: torchdoctor.memory.oom captures the numbers (an OomEvidence) when the exception
ends the script, and `from_evidence` (pure) turns them into the diagnosis: where it failed,
what was asked against what was free, what held the memory, and the fixes ranked by what each
would save on this run.
The periodic pass (`diagnose`) has nothing to add.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.memory.census import Sharding, TensorRecord
from torchdoctor.memory.estimate import Breakdown, FixEstimate, Situation, rank_fixes, shortfall
from torchdoctor.memory.evidence import OomEvidence
from torchdoctor.memory.holders import Holder
from torchdoctor.memory.phases import ModuleGrowth, PhaseMemory
from torchdoctor.units import human

BREAKDOWN_LABELS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state"),
    ("buffers", "buffers"),
    ("activations", "activations"),
    ("other", "other tensors"),
    ("cached_unused", "cached but unused"),
)


@kind("oom")
@dataclasses.dataclass(kw_only=True)
class OomDiagnosisEvidence(Evidence):
    """The capture's numbers (memory.evidence.OomEvidence's fields) and what the diagnosis
    adds: the ranked fixes, the shortfall, the breakdown in words."""

    exception: str = ""
    message: str = ""
    device: str | None = None
    breakdown: Breakdown = dataclasses.field(default_factory=Breakdown)
    situation: Situation = dataclasses.field(default_factory=Situation)
    asked: int | None = None
    step: int | None = None
    phase: str | None = None
    module: str | None = None
    module_type: str | None = None
    location_source: str | None = None
    location_note: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = optional()
    candidates: list[str] | None = optional()
    message_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    tensor_bytes: int = 0
    not_in_tensors: int | None = None
    top_tensors: list[TensorRecord] = dataclasses.field(default_factory=list)
    optimizers: list[str] = dataclasses.field(default_factory=list)
    models: list[list[str]] = dataclasses.field(default_factory=list)  # [label, class name]
    holders: list[Holder] = dataclasses.field(default_factory=list)
    phases: list[PhaseMemory] = dataclasses.field(default_factory=list)
    modules: list[ModuleGrowth] = dataclasses.field(default_factory=list)
    traced_step: int | None = None
    snapshot: str | None = None
    run_dir: str | None = None
    fixes: list[FixEstimate] = dataclasses.field(default_factory=list)
    shortfall: int | None = None
    breakdown_human: dict[str, str] = dataclasses.field(default_factory=dict)
    sharding: Sharding | None = optional()  # a sharded model's local and whole figures


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return []


def breakdown_text(breakdown: Breakdown) -> str:
    raw = breakdown.as_dict()
    parts = []
    for key, label in BREAKDOWN_LABELS:
        value = raw.get(key)
        if value is None or (key in ("buffers", "cached_unused") and not value):
            continue
        parts.append(f"{label} {human(value)}")
    return ", ".join(parts)


def sharding_text(b: Breakdown, sharding: Sharding | None) -> str:
    """A sharded model: what this rank holds of the whole, and the largest FSDP2 all-gather."""
    if not sharding:
        return ""
    out = ""
    world = int(sharding.world or 1)
    total = sharding.total or {}
    whole = sum(int(total.get(k, 0)) for k in ("parameter", "gradient", "optimizer_state"))
    if world > 1:
        here = b.parameters + b.gradients + b.optimizer_state
        out += (
            f" Parameters, gradients and optimizer state are this rank's local shards: "
            f"{human(here)} of {human(whole)} total (world {world})."
        )
    units = sharding.units or []
    if units:
        unit = units[0]
        out += (
            f" FSDP2 materialises one unit's parameters whole in its forward and backward: "
            f"the largest, {unit.name}, {human(unit.unsharded)}."
        )
    return out


def from_evidence(evidence: OomEvidence) -> Diagnosis:
    """The `oom` diagnosis from the captured numbers (see torchdoctor.memory.oom.capture)."""
    b = evidence.breakdown
    s = dataclasses.replace(evidence.situation)
    if s.asked is None and evidence.asked is not None:
        s.asked = int(evidence.asked)
    fixes = rank_fixes(b, s)
    out = evidence.to_json()
    out["fixes"] = [f.as_dict() for f in fixes]
    out["shortfall"] = shortfall(b, s)
    out["breakdown_human"] = {k: human(v) for k, v in b.as_dict().items() if v is not None}

    device = str(evidence.device or s.device)
    what = "CUDA out of memory" if device.startswith("cuda") else f"Out of memory ({device})"
    phase = evidence.phase or "other"
    module = evidence.module
    module_type = evidence.module_type
    where = ""
    if module:
        kind = f" ({module_type})" if module_type and module_type != module else ""
        where = f" in the {phase} of {module}{kind}"
    elif phase:
        where = f" in the {phase} phase"
    step = evidence.step
    when = f" at step {step}" if step is not None else ""
    asked = f"asked for {human(s.asked)}" if s.asked is not None else "an allocation failed"
    room = ""
    if s.available is not None:
        room = f" with {human(s.available)} available"
        if s.capacity:
            room += f" of {human(s.capacity)}"
    held = breakdown_text(b)
    summary = f"{what}{where}{when}: {asked}{room}."
    if held:
        summary += f" Held: {held}."
    summary += sharding_text(b, evidence.sharding)
    if evidence.location_source in ("autograd_function", "traced_backward"):
        summary += f" (Module: {evidence.location_note}.)"

    location = module
    if not location and evidence.file:
        location = f"{evidence.file}:{evidence.line}"
    fix_lines = [_line(f.text, f.enough) for f in fixes]
    if not fix_lines:
        fix_lines = ["find what holds the memory: `torchdoctor memory RUN_DIR` and python.tensors"]
    return Diagnosis(
        kind="oom",
        severity="error",
        summary=summary,
        location=location,
        step=int(step) if step is not None else None,
        evidence=OomDiagnosisEvidence.from_json(out),
        fix=fix_lines,
    )


def _line(text: str, enough: bool | None) -> str:
    if enough is True:
        return f"{text} (enough on its own)"
    if enough is False:
        return f"{text} (not enough on its own)"
    return text
