"""`uneven_batches`: a rank left its training loop after fewer steps than the others while
they wait in a collective of their next step: the ranks do not have the same number of
batches (a shard per rank without DistributedSampler, no drop_last)."""

from __future__ import annotations

from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

JOB = True  # compares ranks: runs on a job's tables


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    out = []
    for holdup in co.holdups(job):
        left = [r for r in holdup.missing if co.whereabouts(job, holdup, r) == co.LEFT]
        if left:
            out.append(_diagnosis(job, holdup, left))
    return out


def _diagnosis(job: co.JobInputs, holdup: co.Holdup, left: list[int]) -> Diagnosis:
    call = holdup.call
    steps = {str(r): v.steps_done for r, v in sorted(job.ranks.items())}
    waiting = sorted(holdup.waiting)
    parts = []
    ranks: dict[str, dict] = {}
    for rank in left:
        view = job.ranks[rank]
        line = co.user_line(view.stack)
        now = (
            "and exited"
            if view.status == "finished"
            else f"and is now in {co.frame_at(line)}"
            if line
            else "and is past its loop"
        )
        parts.append(f"rank {rank} left its training loop after {view.steps_done} steps {now}")
        ranks[str(rank)] = {
            "steps": view.steps_done,
            "status": view.status,
            "line": f"{line['file']}:{line['lineno']}" if line else None,
            "stack": co.trim_stack(view.stack),
        }
    others = max(job.ranks[r].steps_done for r in waiting)
    text = "; ".join(parts)
    summary = (
        text[:1].upper() + text[1:] + f", while {co.ranks_text(waiting)} (at {others} steps) "
        f"{'waits' if len(waiting) == 1 else 'wait'} in {holdup.label} of "
        f"step {call.step} ({short_site(call.site) or 'site unknown'}) for {holdup.waited:.0f} s: "
        "the ranks do not have the same number of batches."
    )
    return Diagnosis(
        kind="uneven_batches",
        severity="error",
        step=call.step,
        location=short_site(call.site),
        summary=summary,
        evidence={
            "group": holdup.group,
            "seq": holdup.seq,
            "op": call.op,
            "collective": call.describe(),
            "steps": steps,
            "left": ranks,
            "waiting": waiting,
            "waited": holdup.waited,
            "ranks": left,
        },
        fix=[
            "shard the data with DistributedSampler(dataset): it pads every rank to the same "
            "number of samples (drop_last=True drops the remainder instead)",
            "DataLoader(..., drop_last=True) so a short last batch does not make one rank "
            "take an extra step",
            "for inputs that are uneven by nature, wrap the loop in DDP's join() context "
            "(torch.distributed.algorithms.Join) or all_reduce a 'done' flag each step",
        ],
        rank=left[0],
        job=True,
        key=f"uneven_batches:{holdup.group}:{holdup.seq}",
    )
