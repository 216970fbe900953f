"""`collective_mismatch`: the first collective at which the ranks issued different ops, shapes
or dtypes (a collective inside `if rank == 0:`, a last batch of another size), with each
rank's op, shape and line. Live, or from a job directory after the job died of it."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables


@kind("collective_mismatch")
@dataclasses.dataclass(kw_only=True)
class CollectiveMismatchEvidence(Evidence):
    group: str
    seq: int
    ranks: dict[str, CollectiveCall]  # rank -> its call


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    table = co.job_calls(job)
    groups = sorted({g for groups in table.values() for g in groups}, key=lambda g: g != "default")
    out = []
    for group in groups:
        found = first_mismatch(table, group)
        if found is None:
            continue
        split = co.first_divergence(table, group)
        if (
            split is not None
            and split[0] <= found[0]
            and co.left_loop_at(job, table, group, *split)
        ):
            continue  # uneven_batches explains it: a rank left its loop
        out.append(_diagnosis(group, *found))
    return out


def first_mismatch(
    table: dict[int, dict[str, dict[int, co.Call]]], group: str
) -> tuple[int, dict[int, co.Call]] | None:
    """(seq, rank -> call) at the first sequence number of `group` where ranks differ."""
    per_rank = {r: groups[group] for r, groups in table.items() if group in groups}
    if len(per_rank) < 2:
        return None
    seqs = sorted({s for calls in per_rank.values() for s in calls})
    for seq in seqs:
        calls = {r: c[seq] for r, c in per_rank.items() if seq in c}
        if len(calls) < 2:
            continue
        ops = {c.op for c in calls.values()}
        strict = len(ops) == 1 and next(iter(ops)) in co.SAME_SHAPE_OPS
        known = co.typed(calls)
        if len({c.signature(strict, known) for c in calls.values()}) > 1:
            return seq, calls
    return None


def _diagnosis(group: str, seq: int, calls: dict[int, co.Call]) -> Diagnosis:
    kinds: dict[tuple[Any, ...], list[int]] = {}
    for rank, call in sorted(calls.items()):
        kinds.setdefault((call.op, call.shapes, call.dtype, call.site), []).append(rank)
    # The odd ones out first: the smaller the set of ranks, the likelier it has the bug.
    order = sorted(kinds.items(), key=lambda kv: (len(kv[1]), kv[1]))
    parts = []
    for (op, shapes, dtype, site), ranks in order:
        what = op + (f" {shapes}" if shapes else "") + (f" {dtype}" if dtype else "")
        where = f" at {short_site(site)}" if site else ""
        verb = "calls" if len(ranks) == 1 else "call"
        parts.append(f"{ranks_text(ranks)} {verb} {what}{where}")
    odd_site = order[0][0][3]
    name = "" if group == "default" else f" of group {group}"
    step = min(c.step for c in calls.values())
    return Diagnosis(
        kind="collective_mismatch",
        severity="error",
        step=step,
        location=short_site(odd_site),
        summary=(
            f"Collective #{seq}{name} does not line up across ranks: " + "; ".join(parts) + "."
        ),
        evidence=CollectiveMismatchEvidence(
            group=group,
            seq=seq,
            ranks={str(r): c.describe() for r, c in sorted(calls.items())},
        ),
        fix=[
            "every rank must issue the same collectives in the same order, with the same "
            "shapes and dtypes: move collectives out of `if rank == 0:` blocks (compute on "
            "every rank, print on one)",
            "tensors of another size on one rank (a short last batch): drop_last=True, or pad "
            "to a fixed size before the collective",
            "TORCH_DISTRIBUTED_DEBUG=DETAIL makes torch check every collective's shapes "
            "across ranks and raise at the first that differs",
        ],
        rank=order[0][1][0],
        job=True,
        key=f"collective_mismatch:{group}:{seq}",
    )
