"""The ranks' collectives lined up by (process group, sequence number), and the collectives
that hold a job up: shared by the job-level diagnoses (missing_rank, uneven_batches,
collective_mismatch, rank_died, straggler).

A rank records a collective when it issues it (state `issued`) and again when it completes or
fails; the latest row of a (group, seq) tells its state, the first one where it was issued.
Point-to-point calls (send/recv) do not line up across ranks and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from torchdoctor.diagnose import job_end
from torchdoctor.diagnose.hang import classify
from torchdoctor.diagnose.inputs import DEAD, JobInputs, RankView
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.frames import StackFrame, short_site
from torchdoctor.store.columns import Block

STARTUP_WAIT = 300.0  # the doctor's startup grace: before the first step
SAVED_MIN_WAIT = 2.0  # read from a job directory: a collective pending this long at the end
_P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


@dataclasses.dataclass
class Call:
    """One collective of one rank."""

    rank: int
    group: str
    seq: int
    op: str
    shapes: str | None
    dtype: str | None
    time: float  # when it was issued
    duration: float | None
    state: str  # issued, completed or failed
    site: str | None  # file:line of the user's code that issued it
    step: int

    @property
    def pending(self) -> bool:
        return self.state != "completed"

    def signature(self, strict_shapes: bool, typed: bool = True) -> tuple[Any, ...]:
        """What must match across ranks; `typed` False where some rank's call carries no
        tensor to read a dtype from (a scatter's or gather's non-root ranks)."""
        return (self.op, self.dtype if typed else None, self.shapes if strict_shapes else None)

    def describe(self, numbered: bool = False) -> CollectiveCall:
        """The call as a finding shows it; `numbered` with its group and sequence number."""
        return CollectiveCall(
            group=self.group if numbered else None,
            seq=self.seq if numbered else None,
            op=self.op,
            shapes=_shapes(self.shapes),
            dtype=self.dtype,
            site=self.site,
            step=self.step,
            state=self.state,
        )


def typed(calls: dict[int, Call]) -> bool:
    """Every rank's call names its dtype: only then are dtypes compared."""
    return all(c.dtype is not None for c in calls.values())


# Ops whose tensors must have the same shape on every rank (the others may differ by design:
# all_to_all splits, gather/scatter lists that only the root holds, objects).
SAME_SHAPE_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_into_tensor",
        "allgather",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "barrier",
    }
)


def calls_of(rank: int, block: Block) -> dict[tuple[str, int], Call]:
    """(group, seq) -> the rank's collective there, in its latest state."""
    out: dict[tuple[str, int], Call] = {}
    if not block.rows:
        return out
    for r in block.to_records():
        if r["op"] in _P2P:
            continue  # numbered per peer: they do not line up by sequence number
        key = (str(r["group"]), int(r["seq"]))
        first = out.get(key)
        shapes, dtype = r.get("shapes"), r.get("dtype")
        out[key] = Call(
            rank=rank,
            group=key[0],
            seq=key[1],
            op=str(r["op"]),
            shapes=shapes if shapes is not None or first is None else first.shapes,
            dtype=dtype if dtype is not None or first is None else first.dtype,
            time=float(first.time if first else r["time"]),
            duration=r.get("duration"),
            state=str(r["state"]),
            site=r.get("site") or (first.site if first else None),
            step=int(first.step if first else r["step"]),
        )
    return out


def by_group(calls: dict[tuple[str, int], Call]) -> dict[str, dict[int, Call]]:
    out: dict[str, dict[int, Call]] = {}
    for (group, seq), call in calls.items():
        out.setdefault(group, {})[seq] = call
    return out


def job_calls(job: JobInputs) -> dict[int, dict[str, dict[int, Call]]]:
    """rank -> group -> seq -> Call, for every rank with data (worked out once per view)."""
    table = job.memo.get("calls")
    if table is None:
        table = {rank: by_group(calls_of(rank, v.collectives)) for rank, v in job.ranks.items()}
        job.memo["calls"] = table
    return dict(table)


def members(job: JobInputs, group: str, table: dict[int, dict[str, dict[int, Call]]]) -> list[int]:
    """The ranks of a process group: every rank for the default group; for another, the ranks
    its name lists, else the ranks seen issuing in it."""
    if group in ("default", "0", ""):
        return list(range(job.world_size))
    listed = _listed_ranks(group)
    if listed:
        return listed
    return sorted(r for r, groups in table.items() if group in groups)


def _listed_ranks(group: str) -> list[int]:
    m = re.search(r"\[([\d,\s]+)\]\s*$", group) or re.search(r"ranks?\s*([\d,\s]+)$", group)
    if not m:
        return []
    return sorted({int(x) for x in re.findall(r"\d+", m.group(1))})


@dataclasses.dataclass
class Holdup:
    """A collective some ranks wait in while others never issued it."""

    group: str
    seq: int
    call: Call  # as the first waiting rank issued it
    waiting: dict[int, Call]  # rank -> its pending (or failed) call at this seq
    missing: list[int]  # members that never issued it
    unknown: list[int]  # members whose collectives cannot be seen (unreachable, no data)
    waited: float  # the longest wait so far (or until the waiting rank stopped)
    last_seq: dict[int, int | None]  # missing rank -> the last seq it issued in the group

    @property
    def label(self) -> str:
        group = "" if self.group == "default" else f" of group {self.group}"
        return f"{self.call.op} #{self.seq}{group}"


def holdups(job: JobInputs) -> list[Holdup]:
    """For each group, the first collective that ranks have waited in for at least the hang
    timeout while some members never issued it. A pending call that every member issued is
    passed over: it waits for the backend, not for a rank (or its completion was not seen yet,
    as for a rank stopped right after it), and a later one may be the holdup."""
    table = job_calls(job)
    threshold = job.hang_timeout if job.live else min(job.hang_timeout, SAVED_MIN_WAIT)
    groups = sorted({g for groups in table.values() for g in groups}, key=lambda g: g != "default")
    out = []
    for group in groups:
        pending: dict[int, dict[int, Call]] = {}  # seq -> rank -> its pending call there
        for rank, groups_of in table.items():
            for call in groups_of.get(group, {}).values():
                if call.pending:
                    pending.setdefault(call.seq, {})[rank] = call
        for seq in sorted(pending):
            holdup = _holdup(job, table, group, seq, pending[seq], threshold)
            if holdup is not None:
                out.append(holdup)
                break
    return out


def _holdup(
    job: JobInputs,
    table: dict[int, dict[str, dict[int, Call]]],
    group: str,
    seq: int,
    waiting: dict[int, Call],
    threshold: float,
) -> Holdup | None:
    # Every rank pending there waits, once one of them has waited for its threshold (the
    # others' waits are counted up to their last report, which may be a moment old).
    waits = {r: max(0.0, _clock(job, job.ranks[r]) - c.time) for r, c in waiting.items()}
    if not any(w >= _threshold(job, job.ranks[r], threshold) for r, w in waits.items()):
        return None
    missing, unknown, last = [], [], {}
    began = min(c.time for c in waiting.values())
    for rank in members(job, group, table):
        if rank in waiting:
            continue
        peer = job.ranks.get(rank)
        seqs = table.get(rank, {}).get(group, {})
        if peer is None or peer.status == "unreachable" or (job.live and peer.status == "unknown"):
            unknown.append(rank)  # what it did since it was last heard of cannot be told
            continue
        if seq in seqs:
            continue  # it issued this one too (and waits, or got through)
        if seqs and max(seqs) > seq:
            continue  # the window does not reach back this far
        if job.live and peer.alive and _clock(job, peer) < began + threshold:
            # Its state was read before the others had waited the threshold: it may have
            # issued the call since; judged at the next gather, never on an old stack.
            return None
        missing.append(rank)
        last[rank] = max(seqs) if seqs else None
    if not missing:
        return None
    call = waiting[min(waiting)]
    return Holdup(group, seq, call, waiting, missing, unknown, max(waits.values()), last)


def _threshold(job: JobInputs, view: RankView, timeout: float) -> float:
    """How long this rank waits before it is held up. Live, before its first step, as long
    as a start may take: ranks start at their own pace (one imports slower, rank 0 prepares the
    data while the others wait in a barrier)."""
    if not job.live or view.steps_done:
        return timeout
    return max(timeout, STARTUP_WAIT)


def _clock(job: JobInputs, view: RankView) -> float:
    if view.clock is not None:
        return view.clock
    if view.ended is not None:
        return view.ended
    return job.now


# -- where a rank is --------------------------------------------------------------------------
LEFT, STUCK, DEAD_RANK, RAISED, UNKNOWN = "left_loop", "stuck", "dead", "raised", "unknown"


def whereabouts(job: JobInputs, holdup: Holdup, rank: int) -> str:
    """Why a rank never issued a collective the others wait in: dead of its own failure,
    raised an error but still running (a thread keeps its process alive), left its training
    loop (finished early), stuck inside the loop, or unknown. A rank the launcher stopped
    afterwards was where its stack says while the others waited."""
    view = job.ranks.get(rank)
    if view is None:
        return UNKNOWN
    ending = job_end.endings(job).get(rank)
    if ending is not None and ending.alive:
        return RAISED  # its code ended in an error: not a shorter loop, not stuck in it
    if view.status in DEAD and (ending is None or ending.kind != job_end.STOPPED):
        return DEAD_RANK
    if view.steps_done > holdup.call.step:
        return STUCK  # it went further than the waiting ranks: not a shorter loop
    if view.status == "finished":
        return LEFT
    if not view.stack:
        return UNKNOWN
    inside = in_loop(job, holdup.call.site, view.stack)
    if inside is None:
        return UNKNOWN
    return STUCK if inside else LEFT


def first_divergence(
    table: dict[int, dict[str, dict[int, Call]]], group: str
) -> tuple[int, dict[int, Call]] | None:
    """(seq, rank -> call) at the first sequence number of `group` where the ranks' calls
    differ in op, shapes, dtype or the line that issued them (two calls of the same shape from
    different lines are paired by the backend without an error: a final all_reduce after the
    loop taken as the next step's gradient all-reduce)."""
    per_rank = {r: groups[group] for r, groups in table.items() if group in groups}
    if len(per_rank) < 2:
        return None
    for seq in sorted({s for calls in per_rank.values() for s in calls}):
        calls = {r: c[seq] for r, c in per_rank.items() if seq in c}
        if len(calls) < 2:
            continue
        ops = {c.op for c in calls.values()}
        strict = len(ops) == 1 and next(iter(ops)) in SAME_SHAPE_OPS
        known = typed(calls)
        if len({(c.signature(strict, known), c.site) for c in calls.values()}) > 1:
            return seq, calls
    return None


@dataclasses.dataclass
class LeftLoop:
    """At one sequence number, ranks that issued a collective after leaving their training
    loop while the others issued one of their next step inside it: uneven data, whatever the
    collective after the loop is (a barrier, a final all_reduce, a checkpoint's broadcast)."""

    group: str
    seq: int
    left: dict[int, Call]  # rank -> the call it issued past its loop
    looping: dict[int, Call]  # rank -> the call of its next step


def left_loop_at(
    job: JobInputs,
    table: dict[int, dict[str, dict[int, Call]]],
    group: str,
    seq: int,
    calls: dict[int, Call],
) -> LeftLoop | None:
    """Whether the calls at (group, seq) differ because some ranks left the training loop: one
    site (the loop's) lies inside a loop of the script, and every other site lies past that
    loop (outside it, not in a loop of its own nested in it); where the sources cannot be read,
    the loop's site is the one its ranks issued from before (the loop repeats it) and the other
    is new to its ranks. None when that is not clear."""
    by_site: dict[str | None, dict[int, Call]] = {}
    for rank, call in calls.items():
        by_site.setdefault(call.site, {})[rank] = call
    sites = [s for s in by_site if s]
    if len(by_site) < 2 or len(sites) != len(by_site):
        return None

    def repeated(site: str) -> bool:
        return all(
            any(c.site == site for s, c in table[r].get(group, {}).items() if s < seq)
            for r in by_site[site]
        )

    def leaves(loop_site: str, other: str) -> bool:
        told = past_loop(job, loop_site, other)
        if told is not None:
            return told
        return repeated(loop_site) and not repeated(other)

    loops = [s for s in sites if all(leaves(s, o) for o in sites if o != s)]
    if len(loops) != 1:
        return None
    inside = by_site[loops[0]]
    step = min(c.step for c in inside.values())
    left: dict[int, Call] = {}
    for site in sites:
        if site == loops[0]:
            continue
        for rank, call in by_site[site].items():
            view = job.ranks.get(rank)
            if view is None or view.steps_done > step:
                return None  # it went further than the others: not a shorter loop
            left[rank] = call
    return LeftLoop(group, seq, left, inside)


def past_loop(job: JobInputs, loop_site: str, site: str) -> bool | None:
    """Whether `site` lies past the innermost loop around `loop_site`: outside it, and not in
    a loop nested inside it (None: the source of `loop_site` cannot be read)."""
    inner = _innermost(job, loop_site)
    if inner is None:
        return None if _loops_of(job, loop_site) is None else False
    path, line = _split(site)
    if path == _split(loop_site)[0] and line is not None and inner[0] <= line <= inner[1]:
        return False
    around = _innermost(job, site)
    if around is None or path != _split(loop_site)[0]:
        return True
    return around[0] <= inner[0] and inner[1] <= around[1]  # an enclosing loop (the epochs)


def _split(site: str) -> tuple[str, int | None]:
    path, _, line = site.rpartition(":")
    return path, int(line) if line.isdigit() else None


def _loops_of(job: JobInputs, site: str) -> list[tuple[int, int]] | None:
    return job.loops.get(_split(site)[0])


def _innermost(job: JobInputs, site: str) -> tuple[int, int] | None:
    ranges, (_, line) = _loops_of(job, site), _split(site)
    if not ranges or line is None:
        return None
    around = [(a, b) for a, b in ranges if a <= line <= b]
    return max(around) if around else None  # the innermost: the one that starts last


def in_loop(job: JobInputs, site: str | None, stack: list[StackFrame]) -> bool | None:
    """Whether a stack is inside the innermost loop around `site` (None: cannot tell)."""
    if not site:
        return None
    inner = _innermost(job, site)
    if inner is None:
        return None
    path = _split(site)[0]
    return any(f.file == path and inner[0] <= int(f.lineno) <= inner[1] for f in stack)


@dataclasses.dataclass
class Stuck:
    """Where a rank's main thread stands: the hang category, the frame it blocks in and the
    innermost frame of the user's own code."""

    category: str
    blocking: StackFrame
    user: StackFrame | None


def where_stuck(stack: list[StackFrame] | None) -> Stuck | None:
    """What a rank's main thread is doing (None without its stack)."""
    if not stack:
        return None
    return Stuck(*classify(stack))


def frame_at(frame: StackFrame) -> str:
    return f"{frame.func}() at {short_site(frame.site)}"


def _shapes(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def trim_stack(stack: list[StackFrame] | None, frames: int = 12) -> list[StackFrame]:
    return list(stack or [])[:frames]
