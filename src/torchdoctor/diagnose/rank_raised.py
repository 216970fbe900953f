"""`rank_raised`: a rank's training ended in an exception, yet its process is still alive: a
non-daemon thread (a logger, an uploader, a prefetcher) keeps the interpreter from exiting, so
the launcher does not see the rank fail and the other ranks wait in their next collective
until the process group's timeout. The error, its line, the threads that hold the process and
what the other ranks wait in. Once the rank is gone, `rank_died` tells the same story."""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose import job_end
from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.hang import thread_names
from torchdoctor.diagnose.inputs import Inputs, JobInputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import ThreadStack, short_site
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables
# Seconds after the raise before a rank whose main thread is not yet seen waiting at exit
# counts as held: between the error and threading's shutdown the interpreter still prints the
# traceback and runs our crash capture (a loaded machine was read in that moment).
SETTLE = 5.0


@dataclasses.dataclass(kw_only=True)
class Waiting(Record):
    """Other ranks doing the same meanwhile, in words."""

    ranks: list[int]
    doing: str


@kind("rank_raised")
@dataclasses.dataclass(kw_only=True)
class RankRaisedEvidence(Evidence):
    rank: int
    error: str
    line: str | None = None
    threads: list[ThreadStack]  # those that keep its process alive
    waiting: list[Waiting]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    out = []
    for ending in job_end.endings(job).values():
        if ending.alive and ending.kind == job_end.RAISED and _held(job, ending):
            out.append(_diagnosis(job, ending))
    return out


def _held(job: JobInputs, ending: job_end.Ending) -> bool:
    """The process is seen kept from exiting: its main thread waits at exit for threads, or
    the raise is SETTLE seconds old by the rank's clock (an exit handler that never returns)."""
    view = job.ranks[ending.rank]
    if view.threads is not None:
        return True
    now = view.clock if view.clock is not None else job.now
    return ending.time is not None and now - ending.time >= SETTLE


def _diagnosis(job: JobInputs, ending: job_end.Ending) -> Diagnosis:
    view = job.ranks[ending.rank]
    threads = view.threads or []
    holding = (
        f"{thread_names(threads)} is not a daemon and keeps it from exiting"
        if len(threads) == 1
        else f"{thread_names(threads)} are not daemons and keep it from exiting"
        if threads
        else "something keeps it from exiting (a non-daemon thread, an exit handler)"
    )
    at = f" at {short_site(ending.line)}" if ending.line else ""
    step = f" at step {ending.step}" if ending.step is not None else ""
    summary = (
        f"Rank {ending.rank} {ending.how}{at}{step}, but its process is still alive: "
        f"{holding}, so the launcher does not see the rank fail"
    )
    waiting = _waiting(job, ending.rank)
    if waiting:
        summary += (
            "; meanwhile "
            + "; ".join(f"{ranks_text(rs)}: {text}" for text, rs in waiting)
            + ", until the process group's timeout ends them"
        )
    summary += "."
    return Diagnosis(
        kind="rank_raised",
        severity="error",
        step=ending.step,
        location=short_site(ending.line),
        summary=summary,
        evidence=RankRaisedEvidence(
            rank=ending.rank,
            error=ending.how.removeprefix("raised "),
            line=ending.line,
            threads=threads,
            waiting=[Waiting(ranks=rs, doing=text) for text, rs in waiting],
        ),
        fix=[
            f"fix rank {ending.rank}'s error first: it is the cause, the others only wait",
            "make the thread a daemon (threading.Thread(..., daemon=True)), or stop and join it "
            "in a `finally:` around the training, so that an error ends the process and the "
            "launcher stops the job at once",
            "init_process_group(timeout=timedelta(minutes=...)) bounds how long the other ranks "
            "wait meanwhile",
        ],
        rank=ending.rank,
        job=True,
        key=f"rank_raised:{ending.rank}",
    )


def _waiting(job: JobInputs, rank: int) -> list[tuple[str, list[int]]]:
    """The other ranks that wait in a collective, grouped by the collective."""
    table = co.job_calls(job)
    groups: dict[str, list[int]] = {}
    for other, view in sorted(job.ranks.items()):
        if other == rank or not view.alive:
            continue
        pending = [c for seqs in table.get(other, {}).values() for c in seqs.values() if c.pending]
        if not pending:
            continue
        call = max(pending, key=lambda c: c.time)  # the latest: an older one may be stale
        name = "" if call.group == "default" else f" of group {call.group}"
        where = f" at {short_site(call.site)}" if call.site else ""
        groups.setdefault(f"waiting in {call.op} #{call.seq}{name}{where}", []).append(other)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
