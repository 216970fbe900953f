"""A long run directory made without training, written with the project's own writers (the
segment writer for the tables, the spiller for diagnoses, rundir for meta.json): for size and
speed budgets that a real run of a million steps would take hours to reach."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import BY_NAME, TableSpec
from torchdoctor.store.segment import SegmentWriter
from torchdoctor.store.tables import Spiller, Tables

MODULES = ("encoder", "encoder.0", "encoder.1", "head")
TRACE_EVERY = 20
T0 = 1_790_000_000.0


def write_run(path: Path, steps: int, spike_at: int, nan_at: int, rank: int = 0) -> Path:
    """A run of `steps` steps: a loss that decays with noise, one step-time spike at
    `spike_at` (a dataloader stall, diagnosed), a NaN loss at `nan_at` (diagnosed)."""
    rng = np.random.default_rng(rank)
    run = rundir.create(path)
    step = np.arange(steps, dtype=np.int64)
    duration = 0.01 + 0.001 * rng.random(steps)
    duration[spike_at] = 2.5
    data_wait = duration * 0.2
    data_wait[spike_at] = 2.4
    forward = (duration - data_wait) * 0.3
    backward = (duration - data_wait) * 0.5
    optimizer = (duration - data_wait) * 0.1
    other = duration - data_wait - forward - backward - optimizer
    time = T0 + np.cumsum(duration)
    loss = 3.0 * np.exp(-step / (steps / 5)) + 0.05 * rng.random(steps)
    loss[nan_at] = math.nan
    grad_norm = 1.0 + rng.random(steps)
    memory = (1 << 30) + (step % 1000) * 4096
    columns = {
        "step": step,
        "time": time,
        "duration": duration,
        "data_wait": data_wait,
        "forward": forward,
        "backward": backward,
        "optimizer": optimizer,
        "other": other,
        "evaluation": np.zeros(steps),
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": np.full(steps, 1e-3),
        "allocated": memory,
        "max_allocated": np.maximum.accumulate(memory),
        "reserved": memory + (64 << 20),
        "rss": memory,
        "rank": np.full(steps, rank, dtype=np.int64),
        "micro_batches": np.ones(steps, dtype=np.int64),
        "skipped": np.zeros(steps, dtype=bool),
        "traced": step % TRACE_EVERY == 1,
    }
    _write(run, BY_NAME["steps"], columns)
    traced = step[step % TRACE_EVERY == 1]
    _write(run, BY_NAME["torch_trace"], _trace(traced, time, rank))
    _write(run, BY_NAME["module_grads"], _grads(traced, rank, rng))
    tables = Tables()
    for at, kind, summary in (
        (spike_at, "dataloader_bound", "step waited 2.4 s for its batch"),
        (nan_at, "nan", "the loss is NaN"),
    ):
        evidence = json.dumps({"step": int(at), "history": list(range(300))})
        fields = (float(time[at]), int(at), rank, kind, "error", "head", summary, evidence)
        tables["diagnoses"].append((*fields, "fix it", None, None))  # not resolved, no cause
    tables["events"].append((T0, 0, "model", json.dumps({"name": "model", "type": "Model"})))
    for depth, name in enumerate(("", *MODULES[1:])):
        tables["modules"].append(("model", name, "Linear", 10, 10, "cpu", "float32", min(depth, 1)))
    spiller = Spiller(tables, run)
    spiller.stop()  # writes diagnoses.jsonl and closes
    rundir.write_meta(
        run, {"pid": 1, "command": ["synthetic"], "status": "finished", "steps": int(steps)}
    )
    return run


def _write(run: Path, spec: TableSpec, columns: dict[str, np.ndarray]) -> None:
    rows = len(next(iter(columns.values())))
    nulls = {c.name: np.zeros(rows, dtype=bool) for c in spec.columns if c.nullable}
    writer = SegmentWriter(run / rundir.TABLES_DIR / f"{spec.name}{rundir.TABLE_SUFFIX}")
    try:
        # Batches of 64k rows, as the spill thread would leave them.
        for lo in range(0, rows, 65_536):
            part = {k: v[lo : lo + 65_536] for k, v in columns.items()}
            part_nulls = {k: v[lo : lo + 65_536] for k, v in nulls.items()}
            writer.write([Block(spec, part, part_nulls, len(part["step"]))])
    finally:
        writer.close()


def _trace(traced: np.ndarray, time: np.ndarray, rank: int) -> dict[str, np.ndarray]:
    n = len(traced) * len(MODULES) * 2
    step = np.repeat(traced, len(MODULES) * 2)
    module = np.tile(np.array([*MODULES, *MODULES], dtype=object), len(traced))
    stage = np.tile(
        np.array(["forward"] * len(MODULES) + ["backward"] * len(MODULES), dtype=object),
        len(traced),
    )
    depth = np.tile(np.array([0, 1, 1, 1, 0, 1, 1, 1]), len(traced))
    duration = np.where(depth == 0, 0.004, 0.001)
    start = np.repeat(time[traced] - 0.009, len(MODULES) * 2)
    offset = np.tile(np.array([0, 0, 0.0011, 0.0022, 0.005, 0.005, 0.0061, 0.0072]), len(traced))
    types = np.tile(
        np.array(["Model", "Linear", "Linear", "Linear"] * 2, dtype=object), len(traced)
    )
    return {
        "step": step,
        "module": module,
        "type": types,
        "stage": stage,
        "duration": duration.astype(np.float64),
        "allocated": np.full(n, 1 << 30, dtype=np.int64),
        "max_allocated": np.full(n, 1 << 30, dtype=np.int64),
        "time": start + offset,
        "depth": depth.astype(np.int64),
        "rank": np.full(n, rank, dtype=np.int64),
    }


def _grads(traced: np.ndarray, rank: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    named = MODULES[1:]
    n = len(traced) * len(named)
    return {
        "step": np.repeat(traced, len(named)),
        "module": np.tile(np.array(named, dtype=object), len(traced)),
        "grad_norm": 10.0 ** rng.uniform(-3, 1, n),
        "param_norm": np.ones(n),
        "with_grad": np.ones(n, dtype=np.int64),
        "trainable": np.ones(n, dtype=np.int64),
        "rank": np.full(n, rank, dtype=np.int64),
    }
