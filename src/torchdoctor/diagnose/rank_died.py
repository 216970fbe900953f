"""`rank_died`: the job-level view of a rank that crashed, was killed or was terminated: which
rank died first, how, at which step and line, and what every other rank was doing then (the
collective it waited in, its own line)."""

from __future__ import annotations

from typing import Any

from torchdoctor.diagnose import collective_order as co
from torchdoctor.diagnose.inputs import DEAD, Inputs, JobInputs, RankView
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site

JOB = True  # compares ranks: runs on a job's tables

# Stopped by someone else (the launcher, after another rank failed) ranks after dying on its own.
_VICTIM = ("terminated",)


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    dead = [v for v in job.ranks.values() if v.status in DEAD]
    if not dead:
        return []
    table = co.job_calls(job)

    def waited(v: RankView) -> bool:
        # Killed without a word while in a collective: it was waiting for someone (its last
        # row says when the hang began, not when it died, so time cannot tell these apart).
        # A rank the backend aborted in a collective (SIGABRT) is a cause, not a waiter.
        if v.status != "killed" or v.signal is not None or v.ended is not None:
            return False
        return any(c.pending for seqs in table.get(v.rank, {}).values() for c in seqs.values())

    first = min(dead, key=lambda v: (v.status in _VICTIM, waited(v), last_seen(v), v.rank))
    others: dict[str, dict[str, Any]] = {}
    parts = []
    for rank, view in sorted(job.ranks.items()):
        if rank == first.rank:
            continue
        doing = _doing(job, view, table.get(rank, {}))
        others[str(rank)] = doing
        parts.append(f"rank {rank} {doing['text']}")
    how = _how(first)
    where = _last_site(first, table.get(first.rank, {}))
    later = [last_seen(v) - last_seen(first) for v in dead if v is not first]
    # Its collectives are written through; its steps table may have lost its last second.
    calls = [c for seqs in table.get(first.rank, {}).values() for c in seqs.values()]
    step = max([first.steps_done, *(c.step for c in calls)])
    summary = f"Rank {first.rank} died first ({how}) at step {step}"
    if where:
        summary += f", last seen at {short_site(where)}"
    if later and min(later) > 0.05:
        summary += f", {min(later):.1f} s before the next rank stopped"
    if parts:
        summary += "; meanwhile " + "; ".join(parts)
    summary += "."
    return [
        Diagnosis(
            kind="rank_died",
            severity="error",
            step=step,
            location=short_site(where),
            summary=summary,
            evidence={
                "rank": first.rank,
                "status": first.status,
                "how": how,
                "exit_code": first.exit_code,
                "signal": first.signal,
                "reason": first.reason,
                "steps": step,
                "last_site": where,
                "dead": sorted(v.rank for v in dead),
                "others": others,
            },
            fix=[
                f"read rank {first.rank}'s own error first (its log, or "
                f"`torchdoctor explain` on it): the other ranks' errors follow from it",
                "killed with no traceback (SIGKILL): usually the kernel's out-of-memory killer "
                "(dmesg) or the scheduler; a signal such as SIGABRT: a native crash",
                "torchrun stops every rank when one fails: the others' timeouts and "
                "'connection closed' errors are consequences, not causes",
            ],
            rank=first.rank,
            job=True,
            key=f"rank_died:{first.rank}",
        )
    ]


def last_seen(view: RankView) -> float:
    """When the rank was last heard of: its end if known, else its last recorded row."""
    if view.ended is not None:
        return view.ended
    times = [0.0]
    if view.steps.rows:
        times.append(float(view.steps.data["time"][-1]))
    if view.collectives.rows:
        times.append(float(view.collectives.data["time"].max()))
    return max(times)


def _how(view: RankView) -> str:
    if view.signal:
        verb = "terminated" if view.status == "terminated" else "killed"
        return f"{verb} by {view.signal}"
    if view.reason:
        return view.reason
    if view.exit_code is not None:
        return f"{view.status}, exit code {view.exit_code}"
    if view.status == "killed":  # gone without writing how: nothing runs after these
        return "killed without a word: SIGKILL or the kernel's OOM killer"
    return view.status


def _last_site(view: RankView, groups: dict[str, dict[int, co.Call]]) -> str | None:
    line = co.user_line(view.stack)
    if line is not None:
        return f"{line['file']}:{line['lineno']}"
    calls = [c for seqs in groups.values() for c in seqs.values()]
    return max(calls, key=lambda c: c.time).site if calls else None


def _doing(job: JobInputs, view: RankView, groups: dict[str, dict[int, co.Call]]) -> dict[str, Any]:
    pending = [c for seqs in groups.values() for c in seqs.values() if c.pending]
    out: dict[str, Any] = {"status": view.status, "steps": view.steps_done}
    state = "" if view.status == "running" else f" (then {view.status})"
    if pending:
        call = min(pending, key=lambda c: c.time)
        out["collective"] = call.describe() | {"group": call.group, "seq": call.seq}
        at = f" at {short_site(call.site)}" if call.site else ""
        name = "" if call.group == "default" else f" of group {call.group}"
        out["text"] = f"was waiting in {call.op} #{call.seq}{name}{at}{state}"
        return out
    line = co.user_line(view.stack)
    if line is not None:
        out["line"] = f"{line['file']}:{line['lineno']}"
        out["text"] = f"was in {co.frame_at(line)}{state}"
        return out
    if view.status == "unreachable":
        out["text"] = f"cannot be reached ({view.reason})"
        return out
    out["text"] = f"was at step {view.steps_done}{state}"
    return out
