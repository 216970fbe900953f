"""`uneven_batches`: a rank left its training loop after fewer steps than the others while
they wait in a collective of their next step: the ranks do not have the same number of
batches (a shard per rank without DistributedSampler, no drop_last)."""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import StackFrame, first_user, short_site
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables


@dataclasses.dataclass(kw_only=True)
class LeftRank(Record):
    """A rank that left its training loop: its steps, and where it is now (its status, line
    and stack) or the collective it called after its loop (`call`)."""

    steps: int
    status: str | None = optional()
    line: str | None = optional()
    stack: list[StackFrame] | None = optional()
    call: CollectiveCall | None = optional()


@kind("uneven_batches")
@dataclasses.dataclass(kw_only=True)
class UnevenBatchesEvidence(Evidence):
    group: str
    seq: int
    op: str
    collective: CollectiveCall
    steps: dict[str, int]  # rank -> steps done
    left: dict[str, LeftRank]
    waiting: list[int]
    waited: float | None = optional()
    ranks: list[int]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    out = []
    for holdup in co.holdups(job):
        left = [r for r in holdup.missing if co.whereabouts(job, holdup, r) == co.LEFT]
        if left:
            out.append(_diagnosis(job, holdup, left))
    table = co.job_calls(job)
    groups = sorted({g for groups in table.values() for g in groups}, key=lambda g: g != "default")
    for group in groups:
        found = co.first_divergence(table, group)
        if found is None:
            continue
        odd = co.left_loop_at(job, table, group, *found)
        if odd is not None:
            out.append(_after_loop(job, odd))
    return out


def _after_loop(job: co.JobInputs, odd: co.LeftLoop) -> Diagnosis:
    """Some ranks left their loop and issued another collective (a barrier, a final
    all_reduce, a checkpoint's broadcast) where the others issued the next step's."""
    looping = sorted(odd.looping)
    call = odd.looping[looping[0]]
    kinds: dict[tuple[str, str | None], list[int]] = {}
    for rank, c in sorted(odd.left.items()):
        kinds.setdefault((c.op, c.site), []).append(rank)
    parts = []
    for (op, site), ranks in kinds.items():
        # its collectives are written through; its steps table may lack its last second
        steps = max(job.ranks[ranks[0]].steps_done, odd.left[ranks[0]].step)
        parts.append(
            f"{ranks_text(ranks)} left {'its' if len(ranks) == 1 else 'their'} training loop "
            f"after {steps} steps and called {op} #{odd.seq} at {short_site(site)}"
        )
    text = "; ".join(parts)
    verb = "calls" if len(looping) == 1 else "call"
    name = "" if odd.group == "default" else f" of group {odd.group}"
    summary = (
        text[:1].upper() + text[1:] + f", while {ranks_text(looping)} {verb} {call.op} "
        f"#{odd.seq}{name} of step {call.step} at {short_site(call.site)}: the ranks do not "
        "have the same number of batches, and the collectives after the loop were paired "
        "with the next step's (a hang until the timeout, or gloo aborting a rank)."
    )
    left = {
        str(r): LeftRank(steps=max(job.ranks[r].steps_done, c.step), call=c.describe())
        for r, c in odd.left.items()
    }
    return _finding(
        call,
        summary,
        UnevenBatchesEvidence(
            group=odd.group,
            seq=odd.seq,
            op=call.op,
            collective=call.describe(),
            steps={str(r): v.steps_done for r, v in sorted(job.ranks.items())},
            left=left,
            waiting=looping,
            ranks=sorted(odd.left),
        ),
    )


def _diagnosis(job: co.JobInputs, holdup: co.Holdup, left: list[int]) -> Diagnosis:
    call = holdup.call
    steps = {str(r): v.steps_done for r, v in sorted(job.ranks.items())}
    waiting = sorted(holdup.waiting)
    parts = []
    ranks: dict[str, LeftRank] = {}
    for rank in left:
        view = job.ranks[rank]
        line = first_user(view.stack)
        now = (
            "and exited"
            if view.status == "finished"
            else f"and is now in {co.frame_at(line)}"
            if line
            else "and is past its loop"
        )
        parts.append(f"rank {rank} left its training loop after {view.steps_done} steps {now}")
        ranks[str(rank)] = LeftRank(
            steps=view.steps_done,
            status=view.status,
            line=line.site if line else None,
            stack=co.trim_stack(view.stack),
        )
    others = max(job.ranks[r].steps_done for r in waiting)
    text = "; ".join(parts)
    summary = (
        text[:1].upper() + text[1:] + f", while {ranks_text(waiting)} (at {others} steps) "
        f"{'waits' if len(waiting) == 1 else 'wait'} in {holdup.label} of "
        f"step {call.step} ({short_site(call.site) or 'site unknown'}) for {holdup.waited:.0f} s: "
        "the ranks do not have the same number of batches."
    )
    return _finding(
        call,
        summary,
        UnevenBatchesEvidence(
            group=holdup.group,
            seq=holdup.seq,
            op=call.op,
            collective=call.describe(),
            steps=steps,
            left=ranks,
            waiting=waiting,
            waited=holdup.waited,
            ranks=left,
        ),
    )


def _finding(call: co.Call, summary: str, evidence: UnevenBatchesEvidence) -> Diagnosis:
    """The finding, whichever way the uneven ends were seen: named by its group and the
    collective's number there, so that both ways give one finding."""
    return Diagnosis(
        kind="uneven_batches",
        severity="error",
        step=call.step,
        location=short_site(call.site),
        summary=summary,
        evidence=evidence,
        fix=_FIXES,
        rank=min(evidence.ranks),
        job=True,
        key=f"uneven_batches:{evidence.group}:{evidence.seq}",
    )


_FIXES = [
    "shard the data with DistributedSampler(dataset): it pads every rank to the same number "
    "of samples (drop_last=True drops the remainder instead)",
    "DataLoader(..., drop_last=True) so a short last batch does not make one rank take an "
    "extra step",
    "for inputs that are uneven by nature, wrap the loop in DDP's join() context "
    "(torch.distributed.algorithms.Join) or all_reduce a 'done' flag each step",
]
