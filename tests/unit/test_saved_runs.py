"""Saved runs and job directories read back: the union of ranks, what a job says about its
missing or foreign ranks, and clear errors for directories that are not runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from synthetic import write_run

from torchdoctor.sql.engine import SqlEngine
from torchdoctor.store import rundir
from torchdoctor.store.saved import JobRun, RunNotFound, SavedRun, open_run


def _job(root: Path, ranks: tuple[int, ...], world: int, job: str = "job-1") -> Path:
    for rank in ranks:
        d = write_run(root / f"rank{rank}", 40 + 10 * rank, spike_at=5, nan_at=30, rank=rank)
        meta = rundir.read_meta(d)
        meta.update(rank=rank, world_size=world, job=job)
        rundir.write_meta(d, meta)
    return root


def _sql(run: SavedRun | JobRun, sql: str) -> list[tuple]:
    return SqlEngine(run).execute(sql).rows


def test_a_job_reads_every_rank_with_its_rank_column(tmp_path: Path) -> None:
    run = open_run(_job(tmp_path / "job", (0, 1), world=2))
    assert isinstance(run, JobRun)
    assert run.ranks == [0, 1] and run.warnings == []
    assert _sql(run, "SELECT rank, count(*) FROM python.steps GROUP BY rank ORDER BY rank") == [
        (0, 40),
        (1, 50),
    ]
    # events and modules store no rank: the job adds it from the directory's name.
    assert _sql(run, "SELECT rank, kind FROM python.events ORDER BY rank") == [
        (0, "model"),
        (1, "model"),
    ]
    assert "rank" in run.spec("modules").column_names
    assert _sql(run, "SELECT DISTINCT rank FROM python.modules ORDER BY rank") == [(0,), (1,)]
    # Diagnoses of all ranks, in time order.
    rows = _sql(run, "SELECT rank, kind FROM python.diagnoses")
    assert sorted(rows) == [
        (0, "dataloader_bound"),
        (0, "nan"),
        (1, "dataloader_bound"),
        (1, "nan"),
    ]
    assert run.meta["world_size"] == 2 and run.meta["job"] == "job-1"


def test_a_rank_directory_still_works_alone(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", (0, 1), world=2)
    run = open_run(job / "rank1")
    assert isinstance(run, SavedRun)
    assert _sql(run, "SELECT DISTINCT rank FROM python.steps") == [(1,)]
    assert "rank" not in run.spec("events").column_names


def test_a_missing_rank_is_named_and_the_rest_is_read(tmp_path: Path) -> None:
    run = open_run(_job(tmp_path / "job", (0, 2), world=4))
    assert run.ranks == [0, 2]
    text = "\n".join(run.warnings)
    assert "rank 1 is missing (world size 4)" in text
    assert "rank 3 is missing (world size 4)" in text
    assert _sql(run, "SELECT count(DISTINCT rank) FROM python.steps") == [(2,)]


def test_a_rank_of_another_job_is_left_out(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", (0, 1), world=3)
    _job(tmp_path / "other", (2,), world=3, job="job-2")
    shutil.move(tmp_path / "other" / "rank2", job / "rank2")
    run = open_run(job)
    assert run.ranks == [0, 1]
    (warning,) = run.warnings
    assert "rank 2" in warning and "another job" in warning and "job-2" in warning
    assert _sql(run, "SELECT DISTINCT rank FROM python.steps ORDER BY 1") == [(0,), (1,)]


def test_an_unreadable_rank_is_named_and_the_rest_is_read(tmp_path: Path) -> None:
    job = _job(tmp_path / "job", (0, 1), world=2)
    (job / "rank1" / "tables" / "steps.seg").write_bytes(b"garbage, not a table")
    run = open_run(job)
    assert run.ranks == [0]
    (warning,) = run.warnings
    assert "rank 1" in warning and "steps.seg" in warning


def test_clear_errors_for_what_is_not_a_run(tmp_path: Path) -> None:
    cases = {
        tmp_path / "nope": "no such directory",
        tmp_path / "file.txt": "is a file",
        tmp_path / "empty": "is empty",
        tmp_path / "other": "not a torchdoctor run directory",
    }
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    for path, message in cases.items():
        with pytest.raises(RunNotFound, match=message):
            open_run(path)
    bad = write_run(tmp_path / "bad", 10, spike_at=1, nan_at=2)
    (bad / "tables" / "memory.seg").write_bytes(b"not a table file")
    with pytest.raises(RunNotFound, match=r"memory\.seg is not a torchdoctor table file"):
        open_run(bad)


def test_a_job_with_no_readable_rank_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "job" / "rank0").mkdir(parents=True)
    (tmp_path / "job" / "rank0" / "junk").write_text("x")
    with pytest.raises(RunNotFound, match="no readable rank directory"):
        open_run(tmp_path / "job")


def test_recorded_tells_an_empty_run_from_a_run(tmp_path: Path) -> None:
    empty = rundir.create(tmp_path / "empty-run")
    rundir.write_meta(empty, {"status": "running"})
    assert not SavedRun(empty).recorded()
    full = write_run(tmp_path / "run", 10, spike_at=1, nan_at=2)
    assert SavedRun(full).recorded()
    assert json.loads((full / "meta.json").read_text())["steps"] == 10
