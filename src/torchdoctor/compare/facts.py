"""One run's facts for a comparison, gathered with SQL alone (`execute(sql) -> (columns,
rows)`), so a live process (through its query route) and a saved run or job (through DuckDB
over its files) give the same facts; plus its meta.json and the copy of its script.

Only what a comparison reads is fetched, and bounded: the steps of every rank (paged), each
module's time on its last MAX_TRACED traced steps, memory at the phase ends of those steps, and
small aggregates (collectives per rank and op, the DataLoaders seen, torch.compile events).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from torchdoctor.store.rundir import SCRIPT_FILE

Execute = Callable[[str], tuple[list[str], list[Any]]]

PAGE = 100_000  # the live query route answers at most this many rows at a time
MAX_STEPS = 1_000_000
MAX_TRACED = 200  # traced steps per module kept (the most recent)
STEP_COLUMNS = (
    "rank",
    "step",
    "duration",
    "data_wait",
    "forward",
    "backward",
    "optimizer",
    "other",
    "loss",
    "grad_norm",
    "allocated",
    "max_allocated",
    "traced",
)


@dataclasses.dataclass
class ModuleTimes:
    module: str
    type: str
    depth: int
    stage: str  # forward or backward
    steps: list[int]  # traced steps, oldest first
    seconds: list[float]  # time in the module on each of those steps (all its calls)


@dataclasses.dataclass
class RunFacts:
    source: str  # as the user named it: a directory, or a live endpoint
    meta: dict[str, Any]
    steps: dict[str, np.ndarray]  # STEP_COLUMNS over every rank, ordered by rank and step
    primary: int  # the lowest rank with steps: its timings, memory and curves are compared
    ranks: list[int]
    modules: list[ModuleTimes]
    params: list[dict[str, Any]]  # python.modules: name, type, params, trainable, dtype, device
    memory: list[dict[str, Any]]  # python.memory rows of the primary rank (step, phase, ...)
    loaders: list[dict[str, Any]]  # `dataloader` events, in order
    compile: dict[str, int]  # python.compile rows by kind
    compile_seen: bool  # an event said a model runs compiled
    first_calls: list[dict[str, Any]]  # python.shapes rows of the first step recorded
    collectives: list[dict[str, Any]]  # per rank, group and op
    diagnoses: list[dict[str, Any]]  # the latest report of each (rank, kind, location)
    census: dict[str, int] | None  # live only: bytes of live tensors by kind
    script_text: str | None  # the copy of the script saved in the run directory

    def rank_steps(self, rank: int) -> dict[str, np.ndarray]:
        mask = self.steps["rank"] == rank
        return {k: v[mask] for k, v in self.steps.items()}


def collect(
    execute: Execute,
    meta: dict[str, Any],
    source: str,
    run_dir: Path | None = None,
    steps: dict[str, np.ndarray] | None = None,
    live: bool = False,
) -> RunFacts:
    """The facts of one run. `steps` (from `step_block_columns`) spares a saved run the trip
    of its step rows through SQL; `run_dir` is where its script copy may be read."""
    if steps is None:
        steps = fetch_steps(execute)
    ranks = sorted({int(r) for r in steps["rank"].tolist()})
    primary = ranks[0] if ranks else 0
    return RunFacts(
        source=source,
        meta=meta,
        steps=steps,
        primary=primary,
        ranks=ranks,
        modules=module_times(execute, primary),
        params=_rows(
            execute,
            "SELECT DISTINCT model, name, type, params, trainable, device, dtype, depth "
            "FROM python.modules",
        ),
        memory=_rows(
            execute,
            f"""
            SELECT step, phase, allocated, max_allocated, reserved FROM python.memory
            WHERE rank = {primary} AND step >= coalesce((
                SELECT min(step) FROM (SELECT DISTINCT step FROM python.memory
                WHERE rank = {primary} ORDER BY step DESC LIMIT {MAX_TRACED})), 0)
            ORDER BY time
            """,
        ),
        loaders=_events(execute, "dataloader", primary),
        compile={
            str(r["kind"]): int(r["n"])
            for r in _rows(execute, "SELECT kind, count(*) AS n FROM python.compile GROUP BY kind")
        },
        compile_seen=bool(_events(execute, "compile_seen", primary)),
        first_calls=_rows(
            execute,
            f"""
            SELECT call, module, type, depth, input_shapes, input_dtypes, output_dtypes
            FROM python.shapes
            WHERE rank = {primary} AND step = (SELECT min(step) FROM python.shapes
                                               WHERE rank = {primary})
            ORDER BY call
            """,
        ),
        collectives=_rows(
            execute,
            """
            SELECT rank, "group", op, count(*) AS calls, count(DISTINCT step) AS steps,
                   sum(bytes) AS bytes, median(duration) AS duration
            FROM python.collectives GROUP BY ALL ORDER BY rank, "group", op
            """,
        ),
        diagnoses=_latest_diagnoses(execute),
        census=_census(execute) if live else None,
        script_text=_script_copy(run_dir),
    )


def fetch_steps(execute: Execute) -> dict[str, np.ndarray]:
    """Every rank's step rows as columns, page by page (the live route's limit)."""
    cols = ", ".join(STEP_COLUMNS)
    pages: list[list[Any]] = []
    names: list[str] = list(STEP_COLUMNS)
    offset = 0
    while offset < MAX_STEPS:
        names, rows = execute(
            f"SELECT {cols} FROM python.steps ORDER BY rank, step, time "
            f"LIMIT {PAGE} OFFSET {offset}"
        )
        pages.append(list(rows))
        if len(rows) < PAGE:
            break
        offset += PAGE
    rows = [r for page in pages for r in page]
    return _columns(list(names), rows)


def step_block_columns(block: Any) -> dict[str, np.ndarray]:
    """STEP_COLUMNS straight from a saved run's steps block (no SQL)."""
    data = block.data
    order = np.lexsort((data["time"], data["step"], data["rank"]))
    out: dict[str, np.ndarray] = {}
    for name in STEP_COLUMNS:
        values = data[name][order]
        if name in ("rank", "step"):
            out[name] = values.astype(np.int64)
        elif name == "traced":
            out[name] = values.astype(bool)
        else:
            null = block.null_mask(name)[order]
            out[name] = np.where(null, np.nan, values.astype(np.float64))
    return out


def module_times(execute: Execute, rank: int) -> list[ModuleTimes]:
    """Each module's time per traced step (its calls summed), per stage, on the last
    MAX_TRACED traced steps of `rank`."""
    rows = _rows(
        execute,
        f"""
        WITH s AS (
            SELECT module, stage, step, sum(duration) AS seconds, any_value(type) AS type,
                   min(depth) AS depth
            FROM python.torch_trace WHERE rank = {rank} GROUP BY module, stage, step
        )
        SELECT * FROM s
        QUALIFY row_number() OVER (PARTITION BY module, stage ORDER BY step DESC)
                <= {MAX_TRACED}
        ORDER BY module, stage, step
        """,
    )
    out: dict[tuple[str, str], ModuleTimes] = {}
    for r in rows:
        key = (str(r["module"]), str(r["stage"]))
        times = out.get(key)
        if times is None:
            times = out[key] = ModuleTimes(
                key[0], str(r["type"]), int(r["depth"] or 0), key[1], [], []
            )
        times.steps.append(int(r["step"]))
        times.seconds.append(float(r["seconds"] or 0.0))
    return list(out.values())


def _rows(execute: Execute, sql: str) -> list[dict[str, Any]]:
    names, rows = execute(sql)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _events(execute: Execute, kind: str, rank: int) -> list[dict[str, Any]]:
    # A job's events carry the rank of their directory; a single run's have no rank column.
    rows = _rows(
        execute, f"SELECT * FROM python.events WHERE kind = '{kind}' ORDER BY time LIMIT 100"
    )
    out = []
    for r in rows:
        if r.get("rank") not in (None, rank):
            continue
        try:
            data = json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def _latest_diagnoses(execute: Execute) -> list[dict[str, Any]]:
    rows = _rows(
        execute,
        "SELECT rank, kind, severity, location, summary, step FROM python.diagnoses ORDER BY time",
    )
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        latest[(r["rank"], r["kind"], r["location"])] = r
    return list(latest.values())


def _census(execute: Execute) -> dict[str, int] | None:
    try:
        rows = _rows(execute, "SELECT kind, sum(bytes) AS bytes FROM python.tensors GROUP BY kind")
    except Exception:  # the census is the live process's to give; without it, estimates
        return None
    return {str(r["kind"]): int(r["bytes"] or 0) for r in rows}


def _script_copy(run_dir: Path | None) -> str | None:
    if run_dir is None:
        return None
    try:
        return (run_dir / SCRIPT_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _columns(names: list[str], rows: list[Any]) -> dict[str, np.ndarray]:
    """Rows to numpy columns; NULL (None) and the live route's 'nan'/'inf' strings to floats."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    out: dict[str, np.ndarray] = {}
    for name, values in zip(names, cols, strict=True):
        if name in ("rank", "step"):
            out[name] = np.array([int(v or 0) for v in values], dtype=np.int64)
        elif name == "traced":
            out[name] = np.array([bool(v) for v in values], dtype=bool)
        else:
            out[name] = np.array(values, dtype=np.float64)  # None -> nan, 'nan' -> nan
    return out
