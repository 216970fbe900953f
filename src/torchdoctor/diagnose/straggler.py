"""`straggler`: a rank that arrives last at the collectives of step after step, so that every
other rank waits for it; the phase its extra time goes to (data, forward, backward, optimizer,
other) and how much less time the steps would take without the wait. When no phase of its own is
longer (the wait lies outside its work: a busy node, or the clocks of two nodes apart) the
finding is only information: it names the rank and says so.

In a synchronised job every rank's step takes as long as the slowest one's, so step times do
not show the straggler: the issue times of the same collective on each rank do. Per step,
a rank's lateness is how long after the first rank it issued the step's collectives; the
others wait for the last one, and the time they would save is its lead over the second last.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from torchdoctor._json import Record
from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs, JobInputs
from torchdoctor.diagnose.record import Diagnosis

JOB = True  # compares ranks: runs on a job's tables

WINDOW = 50  # recent steps compared
WARMUP = 2  # first steps: process start-up, allocator warm-up
# A straggler is a pattern over many steps: a dozen steps on a shared machine cannot tell a
# slow rank from one descheduled for a while (a 2-rank job with every fix, 13 steps on a
# loaded 2-core machine, once showed one rank last in 9 of its 11 judged steps).
MIN_STEPS = 20
MIN_SHARE = 0.7  # last in this share of the steps
MIN_LEAD = 0.005  # seconds per step ahead of the second last, at least ...
MIN_LEAD_SHARE = 0.1  # ... and this share of the step time
# A phase of the rank's own step explains the wait when it is longer than on the others by at
# least this share of the wait; when none does, the time went outside its work (a starved or
# throttled node, or the clocks of two nodes apart) and the finding is only information.
MIN_EXPLAINED = 0.25
PHASES = ("data_wait", "forward", "backward", "optimizer", "other")
_PHASE_WORDS = {
    "data_wait": "waiting for data",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "the optimizer step",
    "other": "code outside the phases (logging, your own code)",
}


@dataclasses.dataclass(kw_only=True)
class PhaseExcess(Record):
    """A phase's median seconds per step on the straggler and on the other ranks."""

    rank: float
    others: float
    excess: float


@kind("straggler")
@dataclasses.dataclass(kw_only=True)
class StragglerEvidence(Evidence):
    rank: int
    last_in: int
    steps: int
    wait_per_step: float
    step_time: float
    faster: float
    phase: str | None = None
    phases: dict[str, PhaseExcess]  # phase -> its median on this rank and on the others
    lateness: dict[str, float]  # rank -> median seconds after the first rank


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None or len(job.ranks) < 2:
        return []
    found = find(job)
    return [found] if found is not None else []


def lateness(job: JobInputs) -> dict[int, dict[int, float]]:
    """step -> rank -> how long after the first rank it issued that step's collectives
    (default group, steps that every rank with data issued collectives in)."""
    table = co.job_calls(job)
    ranks = [r for r, groups in table.items() if groups.get("default")]
    if len(ranks) < 2:
        return {}
    by_seq: dict[int, dict[int, co.Call]] = {}
    for rank in ranks:
        for seq, call in table[rank]["default"].items():
            by_seq.setdefault(seq, {})[rank] = call
    out: dict[int, dict[int, float]] = {}
    for calls in by_seq.values():
        if len(calls) < len(ranks) or len({c.step for c in calls.values()}) > 1:
            continue
        step = next(iter(calls.values())).step
        first = min(c.time for c in calls.values())
        late = out.setdefault(step, {})
        for rank, call in calls.items():
            late[rank] = max(late.get(rank, 0.0), call.time - first)
    steps = sorted(out)[WARMUP:][-WINDOW:]
    return {s: out[s] for s in steps}


def find(job: JobInputs) -> Diagnosis | None:
    late = lateness(job)
    if len(late) < MIN_STEPS:
        return None
    last: Counter[int] = Counter()
    lead: dict[int, float] = {}  # step -> the last rank's lead over the second last
    for step, per_rank in late.items():
        order = sorted(per_rank.items(), key=lambda kv: kv[1], reverse=True)
        last[order[0][0]] += 1
        lead[step] = order[0][1] - order[1][1]
    rank, count = last.most_common(1)[0]
    share = count / len(late)
    steps = sorted(late)
    saved = sum(lead[s] for s in steps if max(late[s], key=late[s].__getitem__) == rank)
    duration = _durations(job, rank, steps)
    if duration is None or share < MIN_SHARE:
        return None
    total = float(duration.sum())
    per_step = saved / len(steps)
    if total <= 0 or per_step < max(MIN_LEAD, MIN_LEAD_SHARE * float(np.median(duration))):
        return None
    phases = _phase_excess(job, rank, steps)
    phase = max(phases, key=lambda p: phases[p].excess) if phases else None
    if phase is not None and phases[phase].excess < MIN_EXPLAINED * per_step:
        phase = None
    faster = saved / total
    waits = (
        f"the other ranks wait for it at the collectives of {count} of the last {len(steps)} "
        f"steps, {per_step * 1e3:.0f} ms per step (step time "
        f"{float(np.median(duration)) * 1e3:.0f} ms)"
    )
    if phase is not None:
        p = phases[phase]
        summary = (
            f"Rank {rank} is a straggler: {waits}; its extra time goes to "
            f"{_PHASE_WORDS[phase]} ({phase} {p.rank * 1e3:.0f} ms per step against "
            f"{p.others * 1e3:.0f} ms on the others). Without the wait the job's steps "
            f"would take about {faster:.0%} less time."
        )
    else:
        summary = (
            f"Rank {rank} arrives last: {waits}, but none of its phases takes longer than on "
            "the others, so its own work is not the cause: its node was busy or throttled "
            "(other processes, CPU frequency), or the clocks of the nodes differ."
        )
    return Diagnosis(
        kind="straggler",
        severity="warning" if phase is not None else "info",
        step=steps[-1],
        location=None,
        summary=summary,
        evidence=StragglerEvidence(
            rank=rank,
            last_in=count,
            steps=len(steps),
            wait_per_step=per_step,
            step_time=float(np.median(duration)),
            faster=faster,
            phase=phase,
            phases=phases,
            lateness={
                str(r): float(np.median([late[s].get(r, 0.0) for s in steps]))
                for r in sorted(job.ranks)
            },
        ),
        fix=_fixes(phase),
        rank=rank,
        job=True,
        key=f"straggler:{rank}",
    )


def _durations(job: JobInputs, rank: int, steps: list[int]) -> np.ndarray | None:
    view = job.ranks[rank]
    if not view.steps.rows:
        return None
    mask = np.isin(view.steps.data["step"], steps)
    return view.steps.data["duration"][mask] if mask.any() else None


def _phase_excess(job: JobInputs, rank: int, steps: list[int]) -> dict[str, PhaseExcess]:
    medians: dict[int, dict[str, float]] = {}
    for r, view in job.ranks.items():
        if not view.steps.rows:
            continue
        mask = np.isin(view.steps.data["step"], steps)
        if mask.any():
            medians[r] = {p: float(np.median(view.steps.data[p][mask])) for p in PHASES}
    if rank not in medians or len(medians) < 2:
        return {}
    out = {}
    for p in PHASES:
        others = float(np.median([m[p] for r, m in medians.items() if r != rank]))
        out[p] = PhaseExcess(rank=medians[rank][p], others=others, excess=medians[rank][p] - others)
    return out


def _fixes(phase: str | None) -> list[str]:
    by_phase: dict[str | None, list[str]] = {
        "data_wait": [
            "its data loading is slower: more DataLoader workers on that node, a faster or "
            "local copy of its shard, the same preprocessing cost on every rank",
        ],
        "forward": [
            "its compute is slower: another GPU model or clock, a thermally throttled or "
            "shared device, or larger inputs on that rank (sort or bucket by length per step)",
        ],
        "backward": [
            "its compute is slower: another GPU model or clock, a throttled or shared device",
        ],
        "optimizer": [
            "its optimizer step is slower: CPU offload or another device on that rank",
        ],
        "other": [
            "code outside the phases runs longer on it: logging, checkpointing or evaluation "
            "on one rank only; move it off the step or do it on every rank asynchronously",
        ],
    }
    out: list[str] = list(by_phase.get(phase, []))
    out.append(
        '`torchdoctor cluster query "SELECT rank, median(duration), median(data_wait), '
        "median(forward) FROM python.steps GROUP BY rank\"` compares the ranks' phases"
    )
    out.append("check the node it runs on (other jobs, CPU frequency, network)")
    return out
