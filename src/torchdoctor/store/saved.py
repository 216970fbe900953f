"""Finished (or killed) runs read back from disk, served with the same SQL as a live one.

A run directory is one process's record. A job directory holds one run directory per global
rank, `JOB_DIR/rank<N>/`; `JobRun` reads them as one, every table with its `rank` column (the
tables that do not store one, such as events and modules, get it from the directory's name).
`open_run` tells the two apart and is the one way the CLI opens a saved run.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from torchdoctor.store import journal, rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.rotation import read_table
from torchdoctor.store.schema import BY_NAME, DIAGNOSES, INT, STORED, Column, TableSpec
from torchdoctor.store.segment import MAGIC
from torchdoctor.store.tables import diagnosis_from_json

RANK_DIR = re.compile(r"^rank(\d+)$")
RANK = "rank"


class RunNotFound(Exception):
    """The path is not a readable run or job directory; the message says why."""


class SavedRun:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not rundir.is_run_dir(self.path):
            raise RunNotFound(_not_a_run(self.path))
        _check_readable(self.path)
        self.meta = rundir.read_meta(self.path)
        self.truncated: list[str] = []
        self.warnings: list[str] = [f"while it was recorded, {f}" for f in self.failures]
        self._blocks: dict[str, Block] = {}

    @property
    def ranks(self) -> list[int]:
        return [int(self.meta.get(RANK) or 0)]

    @property
    def failures(self) -> list[str]:
        """What failed in torchdoctor while the run was recorded (meta.json's `failures`): what
        those parts record is missing from it."""
        said = self.meta.get("failures")
        return [str(f) for f in said] if isinstance(said, list) else []

    def table_names(self) -> list[str]:
        return [spec.name for spec in STORED]

    def spec(self, name: str) -> TableSpec:
        return BY_NAME[name]

    def block(self, name: str) -> Block:
        if name not in self._blocks:
            self._blocks[name] = self._load(name)
        return self._blocks[name]

    def recorded(self) -> bool:
        """Whether anything at all was saved: a table file or a diagnosis."""
        tables = self.path / rundir.TABLES_DIR
        has_tables = tables.is_dir() and any(
            p.stat().st_size > len(MAGIC) for p in tables.glob(f"*{rundir.TABLE_SUFFIX}")
        )
        has_tables = has_tables or any(_nonempty(p) for p in tables.glob(f"*{journal.SUFFIX}"))
        return has_tables or _nonempty(self.path / rundir.DIAGNOSES_FILE)

    def _load(self, name: str) -> Block:
        spec = BY_NAME[name]
        if name == DIAGNOSES.name:
            return Block.from_rows(spec, load_diagnoses(self.path))
        directory = self.path / rundir.TABLES_DIR
        try:
            if spec.write_through:
                path = journal.path_of(self.path, spec)
                if not path.exists():
                    return Block.empty(spec)
                block, truncated = journal.read(path, spec)
            else:
                block, truncated = read_table(directory, spec)
        except (OSError, ValueError) as exc:
            raise RunNotFound(f"cannot read table {name} in {directory}: {exc}") from None
        if truncated:
            self.truncated.append(name)
        return block


@dataclasses.dataclass
class _Rank:
    rank: int
    run: SavedRun


class JobRun:
    """Every rank directory of a job as one run. Rank directories that belong to another job
    are left out, and missing ranks are named, in `warnings`; the rest is read."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.warnings: list[str] = []
        self._ranks = self._open_ranks()
        if not self._ranks:
            raise RunNotFound(f"{self.path}: no readable rank directory in this job directory")
        self.meta = self._job_meta()
        self._specs: dict[str, TableSpec] = {}
        self._blocks: dict[str, Block] = {}

    @property
    def ranks(self) -> list[int]:
        return [r.rank for r in self._ranks]

    @property
    def failures(self) -> list[str]:
        return [f"rank {r.rank}: {f}" for r in self._ranks for f in r.run.failures]

    @property
    def truncated(self) -> list[str]:
        return [f"rank{r.rank}/{name}" for r in self._ranks for name in r.run.truncated]

    def table_names(self) -> list[str]:
        return [spec.name for spec in STORED]

    def spec(self, name: str) -> TableSpec:
        if name not in self._specs:
            self._specs[name] = with_rank(BY_NAME[name])
        return self._specs[name]

    def block(self, name: str) -> Block:
        if name not in self._blocks:
            spec = self.spec(name)
            parts = [_with_rank_column(r.run.block(name), spec, r.rank) for r in self._ranks]
            block = Block.concat(spec, parts)
            if name == DIAGNOSES.name and block.rows:
                block = _take(block, np.argsort(block.data["time"], kind="stable"))
            self._blocks[name] = block
        return self._blocks[name]

    def recorded(self) -> bool:
        return any(r.run.recorded() for r in self._ranks)

    def rank_run(self, rank: int) -> SavedRun:
        return next(r.run for r in self._ranks if r.rank == rank)

    def _open_ranks(self) -> list[_Rank]:
        found: list[_Rank] = []
        explained: set[int] = set()  # ranks left out with a reason already given
        for number, path in rank_dirs(self.path):
            try:
                run = SavedRun(path)
            except RunNotFound as exc:
                self.warnings.append(f"rank {number}: {exc}; the other ranks are read")
                explained.add(number)
                continue
            said = run.meta.get(RANK)
            if said is not None and _as_int(said) != number:
                self.warnings.append(
                    f"rank {number}: {path / rundir.META_FILE} says rank {said}; "
                    f"read as rank {number}, the name of its directory"
                )
            self.warnings += [f"rank {number}: {w}" for w in run.warnings]
            found.append(_Rank(number, run))
        jobs = Counter(str(r.run.meta["job"]) for r in found if r.run.meta.get("job"))
        if len(jobs) > 1:
            # The job most ranks belong to; on a tie, the lowest rank's.
            ours = max(jobs, key=lambda j: (jobs[j], -_first_rank(found, j)))
            for r in [r for r in found if r.run.meta.get("job") not in (None, ours)]:
                self.warnings.append(
                    f"rank {r.rank}: {r.run.path} belongs to another job "
                    f"({r.run.meta['job']!r}, not {ours!r}); left out, the other ranks are read"
                )
                found.remove(r)
                explained.add(r.rank)
        sizes = sorted({s for r in found if (s := _as_int(r.run.meta.get("world_size")))})
        if len(sizes) > 1:
            self.warnings.append(f"the ranks disagree on the world size: {sizes}")
        world = sizes[-1] if sizes else None
        expected = world if world is not None else max((r.rank for r in found), default=-1) + 1
        have = {r.rank for r in found}
        for missing in range(expected):
            if missing not in have and missing not in explained:
                size = f" (world size {world})" if world is not None else ""
                where = self.path / f"rank{missing}"
                self.warnings.append(
                    f"rank {missing} is missing{size}: no readable {where}; "
                    "the other ranks are read"
                )
        return found

    def _job_meta(self) -> dict[str, Any]:
        metas = [r.run.meta for r in self._ranks]
        sizes = [s for m in metas if (s := _as_int(m.get("world_size")))]
        started = [str(m["started"]) for m in metas if m.get("started")]
        ended = [str(m["ended"]) for m in metas if m.get("ended")]
        return {
            "job": metas[0].get("job"),
            "world_size": max(sizes, default=len(metas)),
            "ranks": self.ranks,
            "command": metas[0].get("command"),
            "host": metas[0].get("host"),
            "started": min(started, default=None),
            "ended": max(ended, default=None),
            "status": _job_status([m.get("status") for m in metas]),
            "steps": max((_as_int(m.get("steps")) or 0 for m in metas), default=0),
            "failures": self.failures,
        }


def open_run(path: str | Path) -> SavedRun | JobRun:
    """A run directory, or a job directory of rank directories, for reading."""
    p = Path(path)
    if not p.exists():
        raise RunNotFound(f"{p}: no such directory")
    if not p.is_dir():
        raise RunNotFound(f"{p} is a file, not a run directory")
    if rank_dirs(p):
        return JobRun(p)
    return SavedRun(p)


def rank_dirs(path: Path) -> list[tuple[int, Path]]:
    """The rank<N> subdirectories of a job directory, by rank."""
    try:
        children = list(path.iterdir())
    except OSError:
        return []
    out = []
    for child in children:
        m = RANK_DIR.match(child.name)
        if m and child.is_dir():
            out.append((int(m.group(1)), child))
    return sorted(out)


def with_rank(spec: TableSpec) -> TableSpec:
    """The table as a job serves it: with a rank column (added last when it has none)."""
    if RANK in spec.column_names:
        return spec
    column = Column(RANK, INT, "global rank (from the rank directory's name)")
    return dataclasses.replace(spec, columns=(*spec.columns, column))


def load_diagnoses(run_dir: Path) -> list[tuple]:
    path = run_dir / rundir.DIAGNOSES_FILE
    rows: list[tuple] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            rows.append(diagnosis_from_json(json.loads(line)))
        except (ValueError, TypeError):
            continue  # a line cut short by a kill
    return rows


def _with_rank_column(block: Block, spec: TableSpec, rank: int) -> Block:
    if RANK in block.spec.column_names:
        return Block(spec, block.data, block.nulls, block.rows)
    data = dict(block.data)
    data[RANK] = np.full(block.rows, rank, dtype=np.int64)
    return Block(spec, data, dict(block.nulls), block.rows)


def _take(block: Block, order: np.ndarray) -> Block:
    return Block(
        block.spec,
        {k: v[order] for k, v in block.data.items()},
        {k: v[order] for k, v in block.nulls.items()},
        block.rows,
    )


def _check_readable(path: Path) -> None:
    """Fail now, with the file's name, rather than in the middle of a query."""
    tables = path / rundir.TABLES_DIR
    if not tables.exists():
        return
    try:
        files = sorted(tables.glob(f"*{rundir.TABLE_SUFFIX}"))
        for f in files:
            try:
                with open(f, "rb") as fh:
                    head = fh.read(len(MAGIC))
            except FileNotFoundError:
                continue  # a live run's file, replaced by its compaction since the glob
            if head and head != MAGIC[: len(head)]:
                raise RunNotFound(f"{f} is not a torchdoctor table file")
    except OSError as exc:
        raise RunNotFound(f"cannot read {path}: {exc.strerror or exc}") from None


def _not_a_run(path: Path) -> str:
    if not path.exists():
        return f"{path}: no such directory"
    if not path.is_dir():
        return f"{path} is a file, not a run directory"
    try:
        empty = not any(path.iterdir())
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if empty:
        return f"{path} is empty: no torchdoctor run or job was saved there"
    return (
        f"{path} is not a torchdoctor run directory (no {rundir.META_FILE}, "
        f"no {rundir.TABLES_DIR}/, no rank<N>/ subdirectories)"
    )


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _first_rank(ranks: list[_Rank], job: str) -> int:
    return min(r.rank for r in ranks if str(r.run.meta.get("job")) == job)


def _job_status(statuses: list[Any]) -> str | None:
    known = [s for s in statuses if s]
    if not known:
        return None
    for worst in ("failed", "running"):
        if worst in known:
            return str(worst)
    return str(known[0])
