"""What was heard from each rank: the rows it sent so far (a bounded recent window, merged
across answers), its last answer, or why it could not be asked. Shared by the rank's own
watcher and the CLI's `cluster diagnoses`; `job_inputs()` turns the records into what the
job-level diagnoses read."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any

from torchdoctor._json import decode_as
from torchdoctor.cluster import loops
from torchdoctor.diagnose import replica_drift, same_batches
from torchdoctor.diagnose.inputs import DEAD, JobInputs, RankBatches, RankView
from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import COLLECTIVES, STEPS

_GROUP, _SEQ, _STATE, _SITE, _TIME = (
    COLLECTIVES.index(c) for c in ("group", "seq", "state", "site", "time")
)
STEP_NAMES, CALL_NAMES = STEPS.column_names, COLLECTIVES.column_names
KEEP_STEPS = 512
KEEP_CALLS = 4096
KEEP_CHECKS = 16  # replica checksum steps kept per rank


class RankRecord:
    """What is known of one rank: its recent rows, its last state, or why it is unreachable."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.steps: dict[int, tuple[Any, ...]] = {}
        self.calls: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.cursors: dict[str, int] = {}
        self.state: dict[str, Any] | None = None
        self.entry: dict[str, Any] | None = None
        self.reason: str | None = None  # set while it cannot be reached
        self.gone = False  # its process has exited
        self.heard: float | None = None  # when it last answered
        self.checksums: dict[int, dict[str, Any]] = {}  # step -> model -> replica checksums
        self.batches = RankBatches()  # step -> digest of its batch; its DataLoader

    def update(self, state: dict[str, Any]) -> None:
        self.state = state
        self.reason = None
        self.heard = time.time()
        columns = state.get("columns") or {}
        for name, keep in (("steps", self._add_step), ("collectives", self._add_call)):
            part = state.get(name)
            if not part:
                continue
            order = _order_of(columns.get(name), STEP_NAMES if name == "steps" else CALL_NAMES)
            for row in part.get("rows") or []:
                keep(_reorder(row, order))
            if part.get("cursor") is not None:
                self.cursors[name] = int(part["cursor"])
        order = _order_of(columns.get("collectives"), CALL_NAMES)
        current = [_reorder(row, order) for row in state.get("current") or []]
        for row in current:
            self._add_call(row)
        self._settle({(str(r[_GROUP]), int(r[_SEQ])) for r in current})
        for step, models in replica_drift.checksums_of(
            [{"kind": replica_drift.EVENT, "data": d} for d in state.get("checksums") or []]
        ).items():
            self.checksums.setdefault(step, {}).update(models)
        batches = state.get("batches") or {}
        for step, digest in (batches.get("digests") or {}).items():
            if str(step).isdigit() and isinstance(digest, str):
                self.batches.digests[int(step)] = digest
        if isinstance(batches.get("loader"), dict):
            self.batches.loader = self.batches.loader or batches["loader"]
        self._trim()

    def _settle(self, current: set[tuple[str, int]]) -> None:
        """The rank sends every call still pending: one it no longer sends has completed."""
        for key, row in list(self.calls.items()):
            if row[_STATE] == "issued" and key not in current:
                self.calls[key] = (*row[:_STATE], "completed", *row[_STATE + 1 :])

    def pending_since(self) -> float | None:
        times = [row[_TIME] for row in self.calls.values() if row[_STATE] != "completed"]
        return min(times) if times else None

    def lost(self, reason: str, gone: bool = False) -> None:
        self.reason = reason
        self.gone = gone

    def _add_step(self, row: tuple[Any, ...]) -> None:
        self.steps[int(row[0])] = row

    def _add_call(self, row: tuple[Any, ...]) -> None:
        key = (str(row[_GROUP]), int(row[_SEQ]))
        old = self.calls.pop(key, None)
        if old is not None and row[_SITE] is None:
            row = tuple(o if v is None else v for v, o in zip(row, old, strict=True))
        self.calls[key] = row  # re-inserted: the dict keeps the order rows arrived in

    def _trim(self) -> None:
        if len(self.steps) > KEEP_STEPS:
            for step in sorted(self.steps)[: len(self.steps) - KEEP_STEPS]:
                del self.steps[step]
        for step in sorted(self.checksums)[: max(0, len(self.checksums) - KEEP_CHECKS)]:
            del self.checksums[step]
        digests = self.batches.digests
        for step in sorted(digests)[: max(0, len(digests) - same_batches.RECENT)]:
            del digests[step]
        if len(self.calls) > KEEP_CALLS:
            for key in sorted(self.calls, key=_order)[: len(self.calls) - KEEP_CALLS]:
                del self.calls[key]

    def view(self) -> RankView:
        steps = Block.from_rows(STEPS, [self.steps[k] for k in sorted(self.steps)])
        calls = Block.from_rows(
            COLLECTIVES, [self.calls[k] for k in sorted(self.calls, key=_order)]
        )
        state = self.state or {}
        entry = self.entry or {}
        status: str = "running"
        reason: str | None = None
        meta: dict[str, Any] = {}
        if self.reason is not None:
            status, reason, meta = _lost_status(self.reason, self.gone, entry)
        elif not state:
            status, reason = "unknown", "not heard from yet"
        signal = meta.get("signal")
        return RankView(
            rank=self.rank,
            steps=steps,
            collectives=calls,
            status=status,
            reason=reason,
            stack=decode_as(list[StackFrame], state.get("stack")) if self.reason is None else None,
            # A rank's waits count up to when it told them, not to now: a record gathered a
            # while ago must not show a collective it has completed since as still waiting.
            clock=_float(state.get("time")) if self.reason is None else None,
            phase=state.get("phase"),
            done=state.get("steps_done"),
            ended=_timestamp(meta.get("ended")),
            exit_code=meta.get("exit_code") if isinstance(meta.get("exit_code"), int) else None,
            signal=signal if isinstance(signal, str) else None,
            node=state.get("node", entry.get("node")),
            host=entry.get("host"),
            pid=entry.get("pid"),
            raised=state.get("raised"),
            threads=decode_as(list[ThreadStack], state.get("threads")),
            kinds=tuple(state.get("kinds") or ()),
            checksums=dict(self.checksums),
            batches=RankBatches(dict(self.batches.digests), dict(self.batches.loader)),
        )


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _order(key: Any) -> Any:
    return (str(key[0]), key[1]) if isinstance(key, tuple) else key


def _order_of(names: list[str] | None, ours: tuple[str, ...]) -> list[int | None] | None:
    """Where each of our columns is in a rank's rows (None: the same order as ours)."""
    if not names or tuple(names) == ours:
        return None
    where = {n: i for i, n in enumerate(names)}
    return [where.get(c) for c in ours]


def _reorder(row: list[Any], order: list[int | None] | None) -> tuple[Any, ...]:
    if order is None:
        return tuple(row)
    return tuple(None if i is None or i >= len(row) else row[i] for i in order)


def _lost_status(reason: str, gone: bool, entry: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """A rank that stopped answering: ended (how and when its meta.json says) or
    unreachable; and its meta.json, where it could be read."""
    run_dir = entry.get("run_dir")
    meta = rundir.read_meta(Path(run_dir)) if run_dir else {}
    status = meta.get("status")
    if status in DEAD or status == "finished":
        return str(status), reason, meta
    if gone:
        return "failed", reason + " without recording how (killed?)", meta
    return "unreachable", reason, meta


def _timestamp(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            return _dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return float(value) if isinstance(value, (int, float)) else None


def job_inputs(
    records: dict[int, RankRecord],
    world_size: int,
    hang_timeout: float,
    now: float | None = None,
) -> JobInputs:
    views = {rank: rec.view() for rank, rec in records.items()}
    return JobInputs(
        ranks=views,
        world_size=world_size,
        now=time.time() if now is None else now,
        hang_timeout=hang_timeout,
        live=True,
        loops=loops.loops_of_ranks(views.values()),
    )
