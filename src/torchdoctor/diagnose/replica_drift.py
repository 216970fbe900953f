"""`replica_drift`: parameters that every rank should hold identical (the ones DDP replicates)
differ between ranks. DDP broadcasts them once and then applies the same averaged gradient
everywhere, so its replicas stay bit for bit the same; a copy that drifts apart means one rank
changed its own (an in-place edit under a rank-dependent branch, a checkpoint loaded on one
rank after DDP was built, an update outside the synchronised step) and the ranks now train
different models without an error (BLOOM-176B's replicated layer norms drifted apart across
GPUs unnoticed this way).

Each rank takes a cheap checksum of every replicated parameter (its norm, float32) at the same
steps, locally, with no collective (telemetry/replicas.py), and records it as an event; the
checksums are compared here, live from what the ranks tell each other (cluster/) or from the
rank directories afterwards. One finding per model, at the first checked step where its copies
differ; where the training called the module DDP wraps instead of the wrapper (the event says
`unwrapped`), that is the cause named first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs, JobInputs, event_data
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables

EVENT = "replica_checksums"  # python.events kind: {"step", "model", "names", "sums"[, "unwrapped"]}
RECENT = 4  # checked steps per rank a live answer carries (every model's)
SHOWN = 5  # parameters named in the summary


@dataclasses.dataclass(kw_only=True)
class ParameterDrift(Record):
    """A replicated parameter that differs: the checksum most ranks hold, each odd rank's, and
    the largest relative difference."""

    reference: float
    ranks: dict[str, float] = dataclasses.field(default_factory=dict)
    relative: float = 0.0


@kind("replica_drift")
@dataclasses.dataclass(kw_only=True)
class ReplicaDriftEvidence(Evidence):
    model: str
    step: int
    agreed_at: int | None = None
    ranks: list[int]
    reference_ranks: list[int]
    parameters: dict[str, ParameterDrift]  # the worst ones, by name
    differ: int
    checked: int
    unwrapped: bool = False  # the model trained is a DDP wrapper's module, not the wrapper


def due(steps_done: int) -> bool:
    """Whether the check runs after this many steps: 1, 2, 4, ... 64, then every 100 (the same
    steps on every rank, so that their checksums line up)."""
    if steps_done <= 0:
        return False
    if steps_done <= 64:
        return steps_done & (steps_done - 1) == 0
    return steps_done % 100 == 0


def checksums_of(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """step -> {model -> {"names", "sums"}} from python.events records (data decoded or not)."""
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        data = event_data(record) if record.get("kind") == EVENT else None
        if data is None or "sums" not in data:
            continue
        step = int(data.get("step", record.get("step") or 0))
        copy: dict[str, Any] = {"names": list(data.get("names") or []), "sums": list(data["sums"])}
        if data.get("unwrapped"):
            copy["unwrapped"] = True
        out.setdefault(step, {})[str(data.get("model") or "model")] = copy
    return out


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    return drifts(job)


def drifts(job: JobInputs) -> list[Diagnosis]:
    """For each model, the first checked step at which the ranks' copies differ."""
    have = {r: v.checksums for r, v in job.ranks.items() if v.checksums}
    if len(have) < 2:
        return []
    steps = sorted({s for sums in have.values() for s in sums})
    agreed: dict[str, int] = {}  # model -> the last step its copies were the same
    found: dict[str, Diagnosis] = {}
    for step in steps:
        at = {r: sums[step] for r, sums in have.items() if step in sums}
        if len(at) < 2:
            continue
        for model in sorted({m for models in at.values() for m in models}):
            copies = {r: models[model] for r, models in at.items() if model in models}
            if len(copies) < 2 or model in found:
                continue
            drift = _compare(step, model, copies, agreed.get(model))
            if drift is not None:
                found[model] = drift
            else:
                agreed[model] = step
    return [found[m] for m in sorted(found, key=lambda m: (found[m].step, m))]


def _compare(
    step: int, model: str, copies: dict[int, dict[str, Any]], agreed: int | None
) -> Diagnosis | None:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank, copy in sorted(copies.items()):
        groups.setdefault(tuple(copy["sums"]), []).append(rank)
    if len(groups) < 2:
        return None
    # The copy most ranks hold is the reference; the others drifted from it.
    reference, same = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
    odd = sorted(r for sums, ranks in groups.items() if sums != reference for r in ranks)
    names = copies[same[0]]["names"]
    params: dict[str, ParameterDrift] = {}
    for rank in odd:
        for i, (a, b) in enumerate(zip(reference, copies[rank]["sums"], strict=False)):
            if a == b:
                continue
            name = names[i] if i < len(names) else f"#{i}"
            rel = abs(a - b) / max(abs(a), abs(b), 1e-30)
            entry = params.setdefault(name, ParameterDrift(reference=a))
            entry.ranks[str(rank)] = b
            entry.relative = max(entry.relative, rel)
    worst = sorted(params, key=lambda n: -params[n].relative)
    shown = ", ".join(f"{n} ({params[n].relative:.1e})" for n in worst[:SHOWN])
    more = f" and {len(worst) - SHOWN} more" if len(worst) > SHOWN else ""
    since = f" (at step {agreed} they were the same)" if agreed is not None else ""
    unwrapped = any(copy.get("unwrapped") for copy in copies.values())
    cause = (
        f"The training calls the module that DistributedDataParallel wraps (`{model}`), not "
        "the wrapper: DDP never sees its backward(), so no gradient is averaged and each "
        "rank trains its own copy."
        if unwrapped
        else "DDP keeps them identical, so one rank changed its own: the ranks now train "
        "different models without an error."
    )
    summary = (
        f"Replicated parameters have drifted apart: after {step} steps {ranks_text(odd)} "
        f"{'holds' if len(odd) == 1 else 'hold'} another copy than {ranks_text(same)}{since}: "
        f"{len(params)} of {len(reference)} parameters differ, most {shown}{more} (relative "
        f"difference of their norms). {cause}"
    )
    fixes = [
        f"look for code that changes parameters on {ranks_text(odd)} only: an in-place "
        "edit under `if rank == ...`, a state_dict loaded on one rank after "
        "DistributedDataParallel(model) was built (load it before, on every rank), weight "
        "clipping or an EMA written back on one rank, a device-to-device copy that lost data "
        "(compare a tensor moved between GPUs with its source; NCCL_P2P_DISABLE=1 tells)",
        "an update outside the synchronised step drifts too: gradients that DDP does not "
        "average (the model cast or moved with .to()/.half()/.cpu() after "
        "DistributedDataParallel(model) was built: DDP's gradient hooks stay on the old "
        "tensors; cast and move before wrapping, or wrap again), gradients clipped by a norm "
        "that differs by rank (a norm over rank-local shards that is not all-reduced), an "
        "optimizer over a parameter DDP does not all-reduce: give every rank the same update",
        "to recover now: broadcast rank 0's parameters to every rank "
        "(for p in model.parameters(): dist.broadcast(p.data, src=0)) or restart from a "
        "checkpoint saved before the drift",
    ]
    if unwrapped:
        fixes.insert(
            0,
            f"call the DistributedDataParallel wrapper in the training step, not `{model}` "
            "itself (`ddp_model(x)`, not `ddp_model.module(x)`); keep the raw module for "
            "saving and evaluation only",
        )
    return Diagnosis(
        kind="replica_drift",
        severity="error",
        step=step,
        location=worst[0] if worst else None,  # the parameter's name in the model
        summary=summary,
        evidence=ReplicaDriftEvidence(
            model=model,
            step=step,
            agreed_at=agreed,
            ranks=odd,
            reference_ranks=same,
            parameters={n: params[n] for n in worst[:20]},
            differ=len(params),
            checked=len(reference),
            unwrapped=unwrapped,
        ),
        fix=fixes,
        rank=odd[0],
        job=True,
        key=f"replica_drift:{model}",
    )
