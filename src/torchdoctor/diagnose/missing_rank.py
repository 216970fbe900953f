"""`missing_rank`: ranks wait in collective #N while a rank never arrived, and where that rank
is instead (its own stack and line): the rank that holds the job up, named before the
collective's own timeout fires. A missing rank that died is `rank_died`'s; one that left its
training loop early is `uneven_batches`'."""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.hang import what
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import StackFrame, short_site
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables


@dataclasses.dataclass(kw_only=True)
class AbsentRank(Record):
    """A rank that never called the collective, and where it is instead."""

    status: str
    steps: int
    last_seq: int | None  # its last collective of that group
    phase: str | None
    stack: list[StackFrame]  # its main thread's innermost frames
    category: str | None = optional()  # the hang category of where it stands
    line: str | None = optional()  # file:line of the user's code it stands at, and its source
    code: str | None = optional()


@kind("missing_rank")
@dataclasses.dataclass(kw_only=True)
class MissingRankEvidence(Evidence):
    group: str
    seq: int
    op: str
    collective: CollectiveCall
    waiting: list[int]
    waited: float
    missing: dict[str, AbsentRank]
    unknown: list[int]
    ranks: list[int]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    out = []
    for holdup in co.holdups(job):
        culprits = [
            r for r in holdup.missing if co.whereabouts(job, holdup, r) in (co.STUCK, co.UNKNOWN)
        ]
        if culprits:
            out.append(_diagnosis(job, holdup, culprits))
    return out


def _diagnosis(job: co.JobInputs, holdup: co.Holdup, culprits: list[int]) -> Diagnosis:
    call = holdup.call
    missing: dict[str, AbsentRank] = {}
    parts = []
    location = None
    for rank in culprits:
        view = job.ranks[rank]
        where = co.where_stuck(view.stack)
        last = holdup.last_seq.get(rank)
        entry = AbsentRank(
            status=view.status,
            steps=view.steps_done,
            last_seq=last,
            phase=view.phase,
            stack=co.trim_stack(view.stack),
        )
        if where is not None:
            place = where.user or where.blocking
            entry.category, entry.line, entry.code = where.category, place.site, place.code
            location = location or short_site(entry.line)
            stuck = what(where.category)
            text = f"rank {rank} is stuck {stuck} in {co.frame_at(where.blocking)}"
            if where.user is not None and where.user is not where.blocking:
                text += f", called from {short_site(entry.line)}"
        elif view.status == "unreachable":
            text = f"rank {rank} cannot be reached ({view.reason})"
        else:
            text = f"rank {rank} never called it (its stack was not captured)"
        if last is not None:
            text += f"; its last collective there was #{last}"
        parts.append(text)
        missing[str(rank)] = entry
    waiting = sorted(holdup.waiting)
    summary = (
        f"{ranks_text(waiting).capitalize()} {'waits' if len(waiting) == 1 else 'wait'} "
        f"in {holdup.label} "
        f"(step {call.step}, {short_site(call.site) or 'site unknown'}) for {holdup.waited:.0f} s; "
        f"{ranks_text(culprits)} never called it: " + "; ".join(parts) + "."
    )
    return Diagnosis(
        kind="missing_rank",
        severity="error",
        step=call.step,
        location=location,
        summary=summary,
        evidence=MissingRankEvidence(
            group=holdup.group,
            seq=holdup.seq,
            op=call.op,
            collective=call.describe(),
            # the ranks only: their calls are the collective above (a list of ints stays small
            # at a thousand ranks, and every rank stores this finding)
            waiting=sorted(holdup.waiting),
            waited=holdup.waited,
            missing=missing,
            unknown=holdup.unknown,
            ranks=culprits,
        ),
        fix=[
            f"look at rank {culprits[0]}'s line above: it must reach {call.op} #{holdup.seq} "
            "like the others (a blocking read, a rank-dependent branch, a lock)",
            "make every rank issue the same collectives in the same order: no collective "
            "inside `if rank == ...`, and the same number of batches on every rank",
            "set a timeout so a stuck rank becomes an error: "
            "init_process_group(timeout=timedelta(minutes=5)), DataLoader(timeout=...)",
        ],
        rank=culprits[0],
        job=True,
        key=f"missing_rank:{holdup.group}:{holdup.seq}",
    )
