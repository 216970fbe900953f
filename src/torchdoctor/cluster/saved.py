"""A job directory as the job-level diagnoses read it: each rank's steps and collectives, how
it ended (its meta.json), and its main thread's stack where its own hang diagnosis caught it.
The same diagnosis modules then run as on a live job."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from typing import Any

from torchdoctor.cluster import loops
from torchdoctor.diagnose import job_kinds, job_modules, replica_drift, same_batches
from torchdoctor.diagnose.crash import CrashEvidence
from torchdoctor.diagnose.evidence import Evidence, decode
from torchdoctor.diagnose.hang import HangEvidence, keeping_alive
from torchdoctor.diagnose.inputs import DEAD, Inputs, JobInputs, RankBatches, RankView
from torchdoctor.diagnose.oom import OomDiagnosisEvidence
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import JobRun, SavedRun
from torchdoctor.store.schema import BY_NAME, STEPS

# A job directory does not keep the hang timeout each rank ran with: a collective still
# pending when its rank stopped counts once it had waited for this long.
SAVED_HANG_TIMEOUT = 60.0


def job_inputs(job: JobRun) -> JobInputs:
    views = {rank: rank_view(rank, job.rank_run(rank)) for rank in job.ranks}
    world = int(job.meta.get("world_size") or len(views))
    return JobInputs(
        ranks=views,
        world_size=world,
        now=time.time(),
        hang_timeout=SAVED_HANG_TIMEOUT,
        live=False,
        loops=loops.loops_of_ranks(views.values()),
    )


def rank_view(rank: int, run: SavedRun) -> RankView:
    meta = run.meta
    status = str(meta.get("status") or "unknown")
    steps = run.block("steps")
    collectives = run.block("collectives")
    ended = _timestamp(meta.get("ended")) or _fatal_time(meta)
    own = _own_findings(run)
    main, threads = _last_threads(own)
    view = RankView(
        rank=rank,
        steps=steps,
        collectives=collectives,
        status=status,
        reason=_reason(meta),
        stack=main,
        ended=ended,
        exit_code=_int(meta.get("exit_code")),
        signal=meta.get("signal") if isinstance(meta.get("signal"), str) else None,
        node=meta.get("node"),
        host=meta.get("host"),
        pid=_int(meta.get("pid")),
        raised=raised_of(own),
        threads=threads,
        kinds=tuple(sorted({f.kind for f in own})),
        checksums=_checksums(run.block("events")),
        batches=_batches(run.block("events")),
    )
    if status == "running" or (status in DEAD and ended is None):
        # Nobody wrote how it ended (kill -9): its last row is the last sign of life.
        view.clock = _last_row(steps, collectives)
    return view


def findings(job: JobRun) -> list[Diagnosis]:
    """The job-level diagnoses of a job directory, computed now."""
    inputs = Inputs(
        steps=Block.empty(STEPS),
        module_grads=Block.empty(BY_NAME["module_grads"]),
        events=[],
        config=None,
        now=time.time(),
        job=job_inputs(job),
    )
    out: list[Diagnosis] = []
    for module in job_modules():
        out.extend(module.diagnose(inputs))
    return out


@dataclasses.dataclass(frozen=True)
class OwnFinding:
    """One of a rank's own diagnoses (not a job-level one it reported), evidence typed."""

    kind: str
    evidence: Evidence
    step: int | None = None
    time: float | None = None
    summary: str | None = None
    location: str | None = None

    @classmethod
    def of(cls, record: dict[str, Any]) -> OwnFinding:
        kind = str(record.get("kind"))
        return cls(
            kind=kind,
            evidence=decode(kind, record.get("evidence")),
            step=_int(record.get("step")),
            time=record.get("time"),
            summary=record.get("summary"),
            location=record.get("location"),
        )


def _own_findings(run: SavedRun) -> list[OwnFinding]:
    block = run.block("diagnoses")
    if not block.rows:
        return []
    kinds = job_kinds()
    return [OwnFinding.of(r) for r in block.to_records() if r.get("kind") not in kinds]


def raised_of(findings: list[OwnFinding]) -> dict[str, Any] | None:
    """The error that ended a rank's training, from its own crash or oom diagnosis:
    exception, message, file, line, step, time."""
    for finding in reversed(findings):
        evidence = finding.evidence
        if not isinstance(evidence, (CrashEvidence, OomDiagnosisEvidence)):
            continue
        file, line = evidence.file, evidence.line
        if not file and finding.location and ":" in finding.location:
            file, _, at = finding.location.rpartition(":")
            line = _int(at)
        oom = finding.kind == "oom"
        return {
            "exception": evidence.exception or ("OutOfMemoryError" if oom else None),
            "message": evidence.message or finding.summary,
            "file": file,
            "line": line,
            "step": finding.step,
            "time": finding.time,
            "kind": finding.kind,
        }
    return None


def _last_threads(
    findings: list[OwnFinding],
) -> tuple[list[StackFrame] | None, list[ThreadStack] | None]:
    """The main thread's frames from the rank's last own hang diagnosis, if it had one, and
    the other threads of that capture that keep its process alive."""
    for finding in reversed(findings):
        if not isinstance(finding.evidence, HangEvidence):
            continue
        threads = finding.evidence.threads or []
        main = next((t for t in threads if t.is_main), None)
        if main is None:
            continue
        return list(main.frames), keeping_alive(threads)
    return None, None


def _last_row(steps: Block, collectives: Block) -> float | None:
    times = []
    if steps.rows:
        times.append(float(steps.data["time"].max()))
    if collectives.rows:
        times.append(float(collectives.data["time"].max()))
    return max(times) if times else None


def _checksums(events: Block) -> dict[int, dict[str, Any]]:
    return replica_drift.checksums_of(_records_of(events, (replica_drift.EVENT,)))


def _batches(events: Block) -> RankBatches:
    return same_batches.batches_of(_records_of(events, (same_batches.EVENT, same_batches.LOADER)))


def _records_of(events: Block, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of python.events of `kinds`, as records (their data still JSON text)."""
    if not events.rows:
        return []
    rows = [i for i, k in enumerate(events.column("kind")) if k in kinds]
    return [events.rows_between(i, i + 1).to_records()[0] for i in rows]


def _fatal_time(meta: dict[str, Any]) -> float | None:
    """When faulthandler wrote a fatal signal's stacks: the moment the rank crashed."""
    path = meta.get("fatal_file")
    if not path:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _reason(meta: dict[str, Any]) -> str | None:
    for key in ("reason", "error"):
        if meta.get(key):
            return str(meta[key])
    return None


def _timestamp(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return _dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
