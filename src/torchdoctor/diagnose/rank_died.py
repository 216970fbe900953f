"""`rank_died`: how a job ended, seen across its ranks: the rank whose own failure came first
(its error and line, its signal, its exit code), what every other rank was doing then and how
it ended (lost its peer, timed out, stopped by the launcher), grouped by what they say; or that
the job was stopped as a whole (every rank stopped from outside at once: no rank failed on its
own); or, in a directory that holds only some of the ranks (one node's), that the rank that
went first is not among them.

"First" comes only from real times (job_end.py); a rank killed with SIGKILL leaves none and is
first only when it is the one own failure, or the others lost it before any other failed. A
job whose ranks timed out waiting for a rank that never came is `missing_rank`'s: the rank that
held it up, from the journals."""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose import job_end
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs, JobInputs, RankView
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import first_user, short_site
from torchdoctor.identity import rank_ranges, ranks_text

JOB = True  # compares ranks: runs on a job's tables

MEMORY_KINDS = ("memory_leak", "oom")  # a rank's own findings that make an OOM kill likely


@dataclasses.dataclass(kw_only=True)
class OtherRank(Record):
    """What another rank of the job did meanwhile, and the words that say it."""

    status: str
    steps: int
    ending: str | None = optional()  # how it ended (job_end's kinds), and in words
    how: str | None = optional()
    collective: CollectiveCall | None = optional()  # the latest call it has pending
    line: str | None = optional()  # the user's line it stands at
    text: str = ""


@kind("rank_died")
@dataclasses.dataclass(kw_only=True)
class RankDiedEvidence(Evidence):
    rank: int | None = optional()
    elsewhere: bool | None = optional()
    absent: str | None = optional()
    world_size: int | None = optional()
    whole: bool | None = optional()
    ranks: list[int]
    status: str | None = optional()
    kind: str | None = optional()
    how: str | None = optional()
    known_by: str | None = optional()
    exit_code: int | None = optional()
    signal: str | None = optional()
    reason: str | None = optional()
    steps: int | None = optional()
    last_site: str | None = optional()
    dead: list[int] | None = optional()
    signals: list[str] | None = optional()
    spread: float | None = optional()
    others: dict[str, OtherRank]
    memory: str | None = optional()
    next_after: float | None = optional()


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    ends = job_end.endings(job)
    ended = {r: e for r, e in ends.items() if not e.alive}
    if not ended:
        return []
    first, known = job_end.first_own(ends)
    if first and first[0].alive:
        return []  # a rank raised first and still runs: rank_raised tells it
    if not first:
        stopped = [e for e in ended.values() if e.kind == job_end.STOPPED]
        if _absent(job):
            return [_elsewhere(job, ended)]
        if job_end.stopped_whole(ended):
            return [_whole(job, ended)]
        if stopped and all(e.kind == job_end.STOPPED for e in ended.values()):
            first, known = [min(stopped, key=lambda e: (e.time or 0, e.rank))], "time"
        else:
            return []  # they timed out waiting: missing_rank names the rank they waited for
    elif _absent(job) and _lost_before(ended, first):
        return [_elsewhere(job, ended)]
    return [_first(job, ended, first, known)]


def _first(
    job: JobInputs, ends: dict[int, job_end.Ending], first: list[job_end.Ending], known: str
) -> Diagnosis:
    table = co.job_calls(job)
    lead = first[0]
    view = job.ranks[lead.rank]
    calls = [c for seqs in table.get(lead.rank, {}).values() for c in seqs.values()]
    last_call = max(calls, key=lambda c: c.time) if calls else None
    line = first_user(view.stack)
    where = lead.line or (line.site if line else None)
    if lead.step is not None:
        step = lead.step
    else:  # its collectives are written through; its steps table may lack its last second
        step = max([view.steps_done - 1, *(c.step for c in calls)]) if calls else view.steps_done
    memory = _memory_evidence(view) if lead.kind == job_end.KILLED else None
    how = lead.how + (f"; {memory}" if memory else "")
    skip = {e.rank for e in first}
    later = [  # seconds from its end to each other rank's, where both are known
        e.time - lead.time
        for e in ends.values()
        if e.rank not in skip and e.time is not None and lead.time is not None
    ]
    if known == "untimed":
        names = ranks_text([e.rank for e in first])
        summary = (
            f"{names.capitalize()} were killed by SIGKILL at about step {step}; none of them "
            "left the time it ended, so which went first cannot be told"
        )
    else:
        verb = "failed first" if lead.kind in (job_end.RAISED, job_end.EXITED) else "went first"
        summary = f"Rank {lead.rank} {verb}: {how}"
        if lead.line:
            summary += f" at {short_site(lead.line)} at step {step}"
        elif line is not None:
            summary += f" at step {step}, in {co.frame_at(line)}"
        elif last_call is not None:
            name = "" if last_call.group == "default" else f" of group {last_call.group}"
            summary += (
                f", last seen in step {step} (its last collective: {last_call.op} "
                f"#{last_call.seq}{name} at {short_site(last_call.site)})"
            )
            where = last_call.site
        else:
            summary += f" at step {step}"
        if lead.after:
            summary += f", {lead.after}"
        if known == "before_peers":
            summary += " (no time of its own: the others lost it before any other rank failed)"
        if later and min(later) > 0.05:
            summary += f", {min(later):.1f} s before the next rank ended"
    groups = _others(job, ends, skip, table)
    if groups:
        summary += "; then " + "; ".join(f"{ranks_text(rs)}: {text}" for text, rs in groups)
    summary += "."
    evidence = RankDiedEvidence(
        rank=lead.rank,
        ranks=[e.rank for e in first],
        status=view.status,
        kind=lead.kind,
        how=lead.how,
        known_by=known,
        exit_code=view.exit_code,
        signal=lead.signal or view.signal,
        reason=view.reason,
        steps=step,
        last_site=where,
        dead=sorted(ends),
        others={str(r): _doing(job, v, table.get(r, {}), ends.get(r)) for r, v in _rest(job, skip)},
    )
    if later:
        evidence.next_after = min(later)
    if memory:
        evidence.memory = memory
    return Diagnosis(
        kind="rank_died",
        severity="error",
        step=step,
        location=short_site(where),
        summary=summary,
        evidence=evidence,
        fix=_fixes(lead, memory),
        rank=lead.rank,
        job=True,
        key=f"rank_died:{lead.rank}",
    )


def _whole(job: JobInputs, ends: dict[int, job_end.Ending]) -> Diagnosis:
    """Every rank stopped from outside at once: no rank failed on its own."""
    table = co.job_calls(job)
    stopped = sorted(ends)
    times = [e.time for e in ends.values() if e.time is not None]
    signals = sorted({e.signal or "a signal" for e in ends.values()})
    gap = max(times) - min(times) if len(times) > 1 else None
    spread = (
        ""
        if gap is None
        else " at the same moment"
        if gap < 0.05
        else f" within {gap:.1f} s of each other"
    )
    summary = (
        f"The job was stopped as a whole: {ranks_text(stopped)} ended by "
        f"{' and '.join(signals)}{spread} (the launcher passing on a signal it got: torchrun "
        "logs 'got signal: 15'; the scheduler; a user). No rank failed on its own"
    )
    groups = _others(job, ends, set(), table, ending=False)
    if groups:
        summary += "; by then " + "; ".join(f"{ranks_text(rs)}: {text}" for text, rs in groups)
    summary += "."
    step = max((v.steps_done for v in job.ranks.values()), default=0)
    return Diagnosis(
        kind="rank_died",
        severity="info",  # nothing failed inside the job: a finding above says why, if any
        step=step,
        summary=summary,
        evidence=RankDiedEvidence(
            whole=True,
            ranks=stopped,
            signals=signals,
            spread=(max(times) - min(times)) if len(times) > 1 else None,
            others={
                str(r): _doing(job, v, table.get(r, {}), ends.get(r)) for r, v in _rest(job, set())
            },
        ),
        fix=[
            "nothing failed inside the job: it was stopped from outside (torchrun's agent got a "
            "signal, the scheduler's time limit or preemption, a user's Ctrl-C or kill)",
            "if it was stopped because it made no progress, `missing_rank` or `hang` above names "
            "where the ranks stood",
        ],
        rank=stopped[0],
        job=True,
        key="rank_died:whole",
    )


def _elsewhere(job: JobInputs, ends: dict[int, job_end.Ending]) -> Diagnosis:
    """Only consequences here, and ranks of the job are not in this directory (another node's
    job directory): the rank that went first is among those."""
    table = co.job_calls(job)
    absent = _absent(job)
    groups = _others(job, ends, set(), table)
    summary = (
        "No rank here failed on its own: "
        + "; ".join(f"{ranks_text(rs)}: {text}" for text, rs in groups)
        + f". {ranks_text(absent).capitalize()} of the {job.world_size} are not in this record "
        "(another node's job directory, or ranks without torchdoctor): the rank that went first "
        "is among them."
    )
    first = min(ends.values(), key=lambda e: (e.time is None, e.time or 0, e.rank))
    return Diagnosis(
        kind="rank_died",
        severity="error",
        step=max((v.steps_done for v in job.ranks.values()), default=0),
        summary=summary,
        evidence=RankDiedEvidence(
            elsewhere=True,
            absent=rank_ranges(absent),
            world_size=job.world_size,
            ranks=sorted(ends),
            others={
                str(r): _doing(job, v, table.get(r, {}), ends.get(r)) for r, v in _rest(job, set())
            },
        ),
        fix=[
            f"read the record of {ranks_text(absent)}: torchdoctor diagnoses on the other "
            "node's job directory, or give every node one TORCHDOCTOR_RUN_DIR on a shared "
            "filesystem so the whole job is read at once",
            "'Connection closed by peer' and timeouts are consequences: the first rank to fail "
            "holds the error that matters",
        ],
        rank=first.rank,
        job=True,
        key="rank_died:elsewhere",
    )


def _absent(job: JobInputs) -> list[int]:
    return [r for r in range(job.world_size) if r not in job.ranks]


def _lost_before(ends: dict[int, job_end.Ending], first: list[job_end.Ending]) -> bool:
    """Whether a rank here lost its peer before the first own failure here: that peer is not
    among the ranks read."""
    start = first[0].time
    if start is None:
        return False
    lost = [e.time for e in ends.values() if e.kind == job_end.PEER_LOST_KIND and e.time]
    return bool(lost) and min(lost) < start - 0.05


def _rest(job: JobInputs, skip: set[int]) -> list[tuple[int, RankView]]:
    return [(r, v) for r, v in sorted(job.ranks.items()) if r not in skip]


def _others(
    job: JobInputs,
    ends: dict[int, job_end.Ending],
    skip: set[int],
    table: dict[int, dict[str, dict[int, co.Call]]],
    ending: bool = True,
) -> list[tuple[str, list[int]]]:
    """What the other ranks did, grouped by the same words: (text, ranks), largest first."""
    groups: dict[str, list[int]] = {}
    for rank, view in _rest(job, skip):
        doing = _doing(job, view, table.get(rank, {}), ends.get(rank) if ending else None)
        groups.setdefault(doing.text, []).append(rank)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))


def _doing(
    job: JobInputs,
    view: RankView,
    groups: dict[str, dict[int, co.Call]],
    ending: job_end.Ending | None,
) -> OtherRank:
    pending = [c for seqs in groups.values() for c in seqs.values() if c.pending]
    out = OtherRank(status=view.status, steps=view.steps_done)
    if ending is not None:
        out.ending = ending.kind
        out.how = ending.how
    if pending:
        call = max(pending, key=lambda c: c.time)  # the latest: an older one may be stale
        out.collective = call.describe(numbered=True)
        at = f" at {short_site(call.site)}" if call.site else ""
        name = "" if call.group == "default" else f" of group {call.group}"
        place = f"{call.op} #{call.seq}{name}{at}"
        if ending is not None and ending.kind == job_end.PEER_LOST_KIND:
            out.text = f"lost a peer in {place} ({ending.how.removeprefix('raised ')})"
        elif ending is not None and ending.kind == job_end.TIMED_OUT_KIND:
            out.text = f"timed out waiting in {place} ({ending.how.removeprefix('raised ')})"
        elif ending is not None and ending.kind == job_end.IN_COLLECTIVE:
            out.text = f"failed in {place} ({ending.how})"
        else:
            out.text = f"waiting in {place}" + _then(ending)
        return out
    line = first_user(view.stack)
    if ending is not None and ending.kind in (job_end.PEER_LOST_KIND, job_end.TIMED_OUT_KIND):
        at = f" at {short_site(ending.line)}" if ending.line else ""
        out.text = f"{ending.how}{at}"
    elif line is not None:
        out.line = line.site
        out.text = f"in {co.frame_at(line)}" + _then(ending)
    elif view.status == "unreachable":
        out.text = f"cannot be reached ({view.reason})"
    elif ending is not None:
        out.text = ending.how
    else:
        out.text = view.status
    return out


def _then(ending: job_end.Ending | None) -> str:
    return f", then {ending.how}" if ending is not None else ""


def _memory_evidence(view: RankView) -> str | None:
    """Why a SIGKILL may be the kernel's OOM killer: the rank's own memory findings, or its
    resident memory grown to several times its start. None: nothing says so."""
    kinds = [k for k in MEMORY_KINDS if k in view.kinds]
    if kinds:
        return f"its own {' and '.join(kinds)} finding: the kernel's OOM killer is likely"
    if view.steps.rows >= 2:
        rss = view.steps.data["rss"]
        first, last = float(rss[0]), float(rss[-1])
        if first > 0 and last >= 2 * first and last - first >= 1 << 30:
            return (
                f"its memory grew from {first / 2**30:.1f} to {last / 2**30:.1f} GiB: the "
                "kernel's OOM killer is likely"
            )
    return None


def _fixes(lead: job_end.Ending, memory: str | None) -> list[str]:
    out = [
        f"read rank {lead.rank}'s own error first (its log, `torchdoctor diagnoses` on its "
        "rank directory, or `torchdoctor explain` on its traceback): the other ranks' errors "
        "follow from it"
    ]
    if lead.kind == job_end.KILLED:
        if memory:
            out.append(
                "an OOM kill: `dmesg | grep -i 'killed process'` confirms it; lower the batch "
                "size or the DataLoader workers' memory, or fix the leak named above"
            )
        else:
            out.append(
                "SIGKILL leaves no traceback: a user's kill -9, the scheduler (time or memory "
                "limit), or the kernel's OOM killer; `dmesg | grep -i 'killed process'` and the "
                "scheduler's log tell which"
            )
    elif lead.kind == job_end.CRASHED:
        out.append(
            f"a native crash ({lead.signal or 'fatal signal'}): its stacks are in its rank "
            "directory's fatal.log; SIGABRT from gloo or NCCL usually follows a collective "
            "mismatch (collective_mismatch or uneven_batches above)"
        )
    out.append(
        "torchrun stops every rank once one fails: the others' timeouts and 'connection closed "
        "by peer' errors are consequences, not causes"
    )
    return out
