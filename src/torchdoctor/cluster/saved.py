"""A job directory as the job-level diagnoses read it: each rank's steps and collectives, how
it ended (its meta.json), and its main thread's stack where its own hang diagnosis caught it.
The same diagnosis modules then run as on a live job."""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from typing import Any

from torchdoctor.cluster import loops
from torchdoctor.diagnose import job_kinds, job_modules, replica_drift
from torchdoctor.diagnose.hang import keeping_alive
from torchdoctor.diagnose.inputs import DEAD, Inputs, JobInputs, RankView
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import JobRun, SavedRun
from torchdoctor.store.schema import BY_NAME, STEPS

# A job directory does not keep the hang timeout each rank ran with: a collective still
# pending when its rank stopped counts once it had waited for this long.
SAVED_HANG_TIMEOUT = 60.0


def job_inputs(job: JobRun) -> JobInputs:
    views = {rank: rank_view(rank, job.rank_run(rank)) for rank in job.ranks}
    files: list[str] = []
    for view in views.values():
        files += [f["file"] for f in view.stack or []]
        if view.collectives.rows:
            files += [s.rpartition(":")[0] for s in set(view.collectives.column("site")) if s]
    world = int(job.meta.get("world_size") or len(views))
    return JobInputs(
        ranks=views,
        world_size=world,
        now=time.time(),
        hang_timeout=SAVED_HANG_TIMEOUT,
        live=False,
        loops=loops.loops_of(files),
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
        kinds=tuple(sorted({str(r.get("kind")) for r in own})),
        checksums=_checksums(run.block("events")),
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


def _own_findings(run: SavedRun) -> list[dict[str, Any]]:
    """The rank's own diagnoses (not the job-level ones it reported), evidence decoded."""
    block = run.block("diagnoses")
    if not block.rows:
        return []
    kinds = job_kinds()
    out = []
    for record in block.to_records():
        if record.get("kind") in kinds:
            continue
        try:
            record["evidence"] = json.loads(record.get("evidence") or "{}")
        except ValueError:
            record["evidence"] = {}
        out.append(record)
    return out


def raised_of(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The error that ended a rank's training, from its own crash or oom diagnosis (the
    records of one rank, evidence decoded): exception, message, file, line, step, time."""
    for record in reversed(findings):
        if record.get("kind") not in ("crash", "oom"):
            continue
        evidence = record.get("evidence") or {}
        if not isinstance(evidence, dict):
            evidence = {}
        file, line = evidence.get("file"), evidence.get("line")
        if not file and record.get("location") and ":" in str(record["location"]):
            file, _, line = str(record["location"]).rpartition(":")
        return {
            "exception": evidence.get("exception")
            or ("OutOfMemoryError" if record["kind"] == "oom" else None),
            "message": evidence.get("message") or record.get("summary"),
            "file": file,
            "line": _int(line),
            "step": record.get("step"),
            "time": record.get("time"),
            "kind": record["kind"],
        }
    return None


def _last_threads(
    findings: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """The main thread's frames from the rank's last own hang diagnosis, if it had one, and
    the other threads of that capture that keep its process alive."""
    for record in reversed(findings):
        if record.get("kind") != "hang":
            continue
        evidence = record.get("evidence") or {}
        threads = evidence.get("threads") if isinstance(evidence, dict) else None
        main = next((t for t in threads or [] if t.get("is_main")), None)
        if main is None:
            continue
        return list(main.get("frames") or []), keeping_alive(threads or [])
    return None, None


def _last_row(steps: Block, collectives: Block) -> float | None:
    times = []
    if steps.rows:
        times.append(float(steps.data["time"].max()))
    if collectives.rows:
        times.append(float(collectives.data["time"].max()))
    return max(times) if times else None


def _checksums(events: Block) -> dict[int, dict[str, Any]]:
    if not events.rows:
        return {}
    rows = [i for i, k in enumerate(events.column("kind")) if k == replica_drift.EVENT]
    return replica_drift.checksums_of([events.rows_between(i, i + 1).to_records()[0] for i in rows])


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
