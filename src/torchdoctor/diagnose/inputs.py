"""What every diagnosis module reads: table snapshots and events, nothing live.

A job of many ranks adds `JobInputs`: several ranks' tables side by side, gathered live from
their endpoints or read from a job directory; the job-level modules read only that.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import SHAPES


@dataclasses.dataclass
class HangCapture:
    """What the hang watchdog saw when no step came for the hang timeout (the `hang`
    diagnosis classifies it)."""

    seconds: float  # since the last step (or the start)
    timeout: float  # the timeout in force
    steps: int  # steps done so far
    threads: list[ThreadStack]  # every thread's stack (telemetry.stacks.capture_all)
    # this rank's collectives issued and not seen completed (python.collectives rows as dicts,
    # oldest first): the one its main thread waits in, when it waits for another rank
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Inputs:
    steps: Block  # python.steps, oldest first
    module_grads: Block  # python.module_grads
    events: list[dict[str, Any]]  # python.events rows, `data` decoded
    config: Any  # the run's Config (hang_timeout, guard, ...)
    now: float  # wall-clock time of this pass
    last_step_time: float | None = None  # wall-clock time of the last step, if any
    hang: HangCapture | None = None  # the watchdog's capture when no step came for long
    compile: Block | None = None  # python.compile: torch.compile events
    job: JobInputs | None = None  # the ranks of the job side by side (job-level diagnoses)
    # The run as it ended (a saved run, the last pass): what a live pass may still learn (the
    # stack samples asked for) will not come.
    final: bool = True
    # CPUs of the machine that ran the training (meta.json's "cpus"), not of the one judging a
    # saved run; None when the record does not say
    cpus: int | None = None
    # reads python.shapes (the module calls of the traced steps) for `shapes`: only when a
    # diagnosis asks, as that table is far larger than the steps and rarely needed
    read_shapes: Callable[[], Block] | None = None

    @classmethod
    def of(
        cls,
        block: Callable[[str], Block],
        config: Any,
        now: float | None = None,
        hang: HangCapture | None = None,
        cpus: int | None = None,
    ) -> Inputs:
        """The inputs from a source of table snapshots: a live run's tables, or a saved run
        (`block(name)` gives a table). `now` defaults to the time of the last step: a saved
        run is judged as it stood when it ended. `cpus`: the recording machine's."""
        steps = block("steps")
        last = float(steps.data["time"][-1]) if steps.rows else None
        return cls(
            steps=steps,
            module_grads=block("module_grads"),
            events=decode_events(block("events")),
            config=config,
            now=now if now is not None else (last or 0.0),
            last_step_time=last,
            hang=hang,
            compile=block("compile"),
            cpus=cpus,
            read_shapes=lambda: block("shapes"),
        )

    @classmethod
    def of_saved(cls, run: Any, config: Any, **options: Any) -> Inputs:
        """The inputs of a saved run (store.saved.SavedRun), with the facts of the machine that
        recorded it from its meta.json."""
        cpus = run.meta.get("cpus") if isinstance(getattr(run, "meta", None), dict) else None
        return cls.of(run.block, config, cpus=cpus if isinstance(cpus, int) else None, **options)

    def column(self, name: str) -> np.ndarray:
        return self.steps.data[name]

    def valid(self, name: str) -> np.ndarray:
        """Mask of rows where a nullable steps column has a value."""
        mask = self.steps.nulls.get(name)
        return np.ones(self.steps.rows, dtype=bool) if mask is None else ~mask

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    @functools.cached_property
    def shapes(self) -> Block:
        """python.shapes: what flowed into and out of each module call of the traced steps."""
        return Block.empty(SHAPES) if self.read_shapes is None else self.read_shapes()


def event_data(record: dict[str, Any]) -> dict[str, Any] | None:
    """A python.events record's data as a dict, whether already decoded or still JSON text;
    None for data that is neither."""
    data = record.get("data")
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def decode_events(block: Block) -> list[dict[str, Any]]:
    out = []
    for record in block.to_records():
        try:
            record["data"] = json.loads(record.get("data") or "{}")
        except ValueError:
            record["data"] = {}
        out.append(record)
    return out


# How a rank that is no longer running ended (meta.json's status, or what its peers saw).
DEAD = ("failed", "crashed", "killed", "terminated")


@dataclasses.dataclass
class RankBatches:
    """What a rank says of its batches (diagnose/same_batches.py): step -> digest of the batch
    its model was given on its sampled steps (telemetry/silent/batches.py), and its first
    DataLoader's facts (its sampler, where it is iterated)."""

    digests: dict[int, str] = dataclasses.field(default_factory=dict)
    loader: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RankView:
    """One rank of a job as the job-level diagnoses see it: its recent rows and its state."""

    rank: int
    steps: Block  # python.steps, oldest first (a recent window)
    collectives: Block  # python.collectives, oldest first (a recent window)
    status: str = "running"  # running, finished, one of DEAD, unreachable or unknown
    reason: str | None = None  # how it ended, or why it cannot be reached
    stack: list[StackFrame] | None = None  # main thread's frames, innermost first
    phase: str | None = None  # data, forward, backward, optimizer or other (live)
    done: int | None = None  # steps done, when known beyond the rows (a live rank's count)
    clock: float | None = None  # its "now": the time it was read, or when it stopped
    ended: float | None = None  # when it stopped (Unix seconds), if it did
    exit_code: int | None = None
    signal: str | None = None  # SIGKILL, SIGABRT, ... when a signal ended it
    node: str | None = None
    host: str | None = None
    pid: int | None = None
    # the error its training ended with (its own crash or oom diagnosis): exception, message,
    # file, line, step, time; a rank may have raised and still run (a non-daemon thread)
    raised: dict[str, Any] | None = None
    # after its main code ended: the threads that keep its process alive
    threads: list[ThreadStack] | None = None
    kinds: tuple[str, ...] = ()  # the kinds of its own diagnoses (memory_leak: an OOM kill?)
    # step -> this rank's checksum of each replicated parameter (telemetry/replicas.py)
    checksums: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    batches: RankBatches = dataclasses.field(default_factory=lambda: RankBatches())

    @property
    def alive(self) -> bool:
        return self.status == "running"

    @property
    def steps_done(self) -> int:
        if self.done is not None:
            return int(self.done)
        return int(self.steps.data["step"].max()) + 1 if self.steps.rows else 0


@dataclasses.dataclass
class JobInputs:
    """The ranks of one job, for the diagnoses that compare them."""

    ranks: dict[int, RankView]  # the ranks with data; unreachable ones with status only
    world_size: int
    now: float
    hang_timeout: float  # a collective waited on for this long holds the job up
    live: bool = True  # gathered from running ranks (False: read from a job directory)
    # file -> (first, last) line of each for/while loop in it: tells a rank still in its
    # training loop from one that left it (read from the sources where they could be read)
    loops: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # what the modules derive alike from the same view (the collectives lined up), once
    memo: dict[str, Any] = dataclasses.field(default_factory=dict)

    def view(self, rank: int) -> RankView | None:
        return self.ranks.get(rank)
