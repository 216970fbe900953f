"""What a rank tells the others about itself: who it is, where its main thread is, its step
and phase, and its recent rows of python.steps and python.collectives (since the asker's
cursor, so that asking again costs only what is new).

A light request (`rows: 0`) carries no table rows but the collectives that matter now: the
pending ones and the last one of each process group.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol

from torchdoctor.cluster.member import node_rank
from torchdoctor.cluster.saved import OwnFinding, raised_of
from torchdoctor.diagnose import replica_drift, same_batches
from torchdoctor.diagnose.hang import keeping_alive, waits_at_exit
from torchdoctor.frames import StackFrame
from torchdoctor.identity import RankIdentity
from torchdoctor.store.schema import COLLECTIVES, EVENTS, STEPS
from torchdoctor.store.table import RingTable
from torchdoctor.store.tables import Tables
from torchdoctor.telemetry import stacks
from torchdoctor.views import TrainingView

MAX_ROWS = 512  # rows per table per answer: the recent window the job diagnoses compare
RECENT = 1024  # collectives rows looked at for the pending ones


class StateHost(Protocol):
    tables: Tables

    @property
    def telemetry(self) -> TrainingView | None: ...


def rank_state(
    host: StateHost,
    member: RankIdentity,
    hang_timeout: float,
    since: dict[str, int] | None = None,
    rows: int = MAX_ROWS,
    findings: bool = False,
) -> dict[str, Any]:
    """`findings`: with the rank's diagnoses too (what `cluster diagnoses` shows), so that one
    request per rank serves it."""
    training = host.telemetry
    if training is not None:
        training.settle_collectives()  # the calls done since this rank's last call or step
    stack = main_stack()
    out: dict[str, Any] = {
        "rank": member.rank,
        "local_rank": member.local_rank,
        "world_size": member.world_size,
        "node": node_rank() or member.node,
        "time": time.time(),
        "status": "running",
        "steps_done": training.steps_done if training is not None else 0,
        "phase": training.phase if training is not None else None,
        "stack": stack,
        "hang_timeout": hang_timeout,
        "columns": {
            "steps": list(STEPS.column_names),
            "collectives": list(COLLECTIVES.column_names),
        },
    }
    out.update(own_findings(host.tables["diagnoses"]))
    if findings:
        block = host.tables["diagnoses"].snapshot()
        names = list(block.spec.column_names)
        columns = [block.column(n) for n in names]
        out["diagnoses"] = {"columns": names, "rows": [list(r) for r in zip(*columns, strict=True)]}
    if waits_at_exit(stack):
        out["threads"] = keeping_alive(stacks.capture_all())
    since = since or {}
    collectives = host.tables["collectives"]
    if rows > 0:
        limit = min(int(rows), MAX_ROWS)
        for name in ("steps", "collectives"):
            got, cursor = table_tail(host.tables[name], since.get(name), limit)
            out[name] = {"rows": got, "cursor": cursor}
        # The pending ones may be older than the window: always send them too.
        out["current"] = current_calls(collectives)
        # The replica checks only with the rows: a light answer stays small (a check carries
        # every parameter's name), and a drift seen 15 s later is still seen.
        events = recent_events(host.tables["events"], JOB_EVENTS)
        out["checksums"] = recent_checksums(events)
        out["batches"] = recent_batches(events)
    else:
        out["current"] = current_calls(collectives)
    return out


def own_findings(table: RingTable) -> dict[str, Any]:
    """The kinds of this rank's own findings, and the error its training ended with (its
    crash or oom diagnosis), for the others' job view."""
    block = table.snapshot()
    if not block.rows:
        return {"kinds": []}
    kinds = [str(k) for k in block.column("kind")]
    ended = [i for i, k in enumerate(kinds) if k in ("crash", "oom")]
    out: dict[str, Any] = {"kinds": sorted(set(kinds))}
    if ended:
        record = block.rows_between(ended[-1], ended[-1] + 1).to_records()[0]
        out["raised"] = raised_of([OwnFinding.of(record)])
    return out


# The events of a rank its peers read: replica checksums, batch digests, its DataLoader
JOB_EVENTS = (replica_drift.EVENT, same_batches.EVENT, same_batches.LOADER)


def recent_events(table: RingTable, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """This rank's events of `kinds` among its last 256, as records ({"kind", "data"}, the data
    as its JSON text): one read of the table for every part of a job view."""
    rows, _ = table_tail(table, None, 256)
    kind, data = EVENTS.index("kind"), EVENTS.index("data")
    return [{"kind": row[kind], "data": row[data]} for row in rows if row[kind] in kinds]


def recent_checksums(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This rank's latest replica checksums (python.events data): those of the last few checked
    steps, every model's."""
    found = [json.loads(e["data"]) for e in events if e["kind"] == replica_drift.EVENT]
    steps = sorted({d.get("step") for d in found if isinstance(d.get("step"), int)})
    recent = set(steps[-replica_drift.RECENT :])
    return [d for d in found if d.get("step") in recent]


def recent_batches(events: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's latest batch digests (its silent.batches facts: step -> digest) and its
    first DataLoader's facts, for the others' job view."""
    got = same_batches.batches_of(events)
    return {"digests": {str(s): d for s, d in got.digests.items()}, "loader": got.loader}


def main_stack() -> list[StackFrame]:
    main = threading.main_thread().ident
    for thread in stacks.capture_all():
        if thread.thread_id == main:
            return list(thread.frames)
    return []


def table_tail(table: RingTable, cursor: int | None, limit: int) -> tuple[list[list[Any]], int]:
    """The rows appended since `cursor` (all-time row count), at most the last `limit`; and the
    new cursor. Reads the sealed blocks in place: no copy of the whole table."""
    blocks = table.blocks()
    total = table.dropped + sum(b.rows for b in blocks)
    start = total - limit if cursor is None else max(int(cursor), total - limit)
    wanted = max(0, total - start)
    out: list[list[Any]] = []
    for block in reversed(blocks):
        if wanted <= 0:
            break
        part = block.tail(max(0, block.rows - wanted))
        columns = [part.column(name) for name in part.spec.column_names]
        out[:0] = [list(row) for row in zip(*columns, strict=True)]
        wanted -= part.rows
    return out, total


def current_calls(table: RingTable) -> list[list[Any]]:
    """The collectives rows that matter now: every pending (group, seq) and the last of each
    group, from the recent rows."""
    rows, _ = table_tail(table, None, RECENT)
    names = COLLECTIVES.column_names
    g, s, st = names.index("group"), names.index("seq"), names.index("state")
    latest: dict[tuple[Any, Any], list[Any]] = {}
    for row in rows:
        latest[(row[g], row[s])] = row
    last: dict[Any, list[Any]] = {}
    for (group, _seq), row in latest.items():
        if group not in last or row[s] > last[group][s]:
            last[group] = row
    pending = [row for row in latest.values() if row[st] != "completed"]
    keep = {id(r): r for r in [*pending, *last.values()]}
    return sorted(keep.values(), key=lambda r: (str(r[g]), r[s]))
