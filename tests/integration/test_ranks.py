"""Ranks of real gloo jobs know who they are and write one job directory: under torchrun
(TORCHDOCTOR=1), as torch.multiprocessing.spawn ranks of `torchdoctor run`, and as processes
that pass their rank to init_process_group themselves."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, free_port, internal_errors, script, td_run, wait_for
from launchers import Job, rank_dirs, torchrun_argv
from recording import query

from torchdoctor.store import rundir

pytestmark = pytest.mark.slow


@pytest.fixture
def job(env: dict[str, str], tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path, env)
    yield j
    j.end()


def _json(*args: str, env: dict[str, str], cwd: Path | None = None) -> Any:
    out = cli(*args, "--format", "json", env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _one_job_dir(cwd: Path) -> Path:
    dirs = sorted((cwd / "torchdoctor-runs").iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_torchrun_ranks_know_who_they_are(job: Job, env: dict[str, str], tmp_path: Path) -> None:
    argv = torchrun_argv(2, script("dist_job.py"), "--steps", "2", "--until-stop")
    job.start(argv, {"TORCHDOCTOR": "1", "TORCHDOCTOR_QUIET": "1"})

    def two_entries() -> bool:
        # cheap, in this process, while the ranks start: their probes' entries in the socket
        # directory (the CLI is asked once they are there)
        assert job.procs[0].poll() is None, job.output()
        return len(list(Path(env["TORCHDOCTOR_SOCKET_DIR"]).glob("*.json"))) >= 2

    def two_ranks() -> Any:
        assert job.procs[0].poll() is None, job.output()
        listed = _json("list", "--no-step", env=env)
        return listed if len(listed) == 2 else None

    wait_for(two_entries, 120, "two probes", interval=0.1)
    listed = sorted(wait_for(two_ranks, 120, "two probed ranks"), key=lambda e: e["rank"])
    assert [e["rank"] for e in listed] == [0, 1]
    assert [e["local_rank"] for e in listed] == [0, 1]
    assert {e["world_size"] for e in listed} == {2}
    assert {e["node"] for e in listed} == {socket.gethostname()}
    jobs = {e["job"] for e in listed}
    assert len(jobs) == 1 and None not in jobs
    table = cli("list", "--no-step", env=env).stdout
    header = table.splitlines()[0].split()
    assert header[:7] == ["pid", "rank", "world_size", "node", "job", "started", "directory"], table

    (tmp_path / "stop").touch()
    assert job.wait() == [0], job.output()
    job_dir = _one_job_dir(tmp_path)
    assert sorted(p.name for p in job_dir.iterdir()) == ["rank0", "rank1"]
    for rank, d in enumerate(rank_dirs(job_dir, 2)):
        meta = rundir.read_meta(d)
        assert (meta["rank"], meta["local_rank"], meta["world_size"]) == (rank, rank, 2)
        assert meta["job"] in jobs and meta["status"] == "finished"
    rows = query(job_dir, "SELECT DISTINCT rank FROM python.steps ORDER BY 1")
    assert rows == [{"rank": 0}, {"rank": 1}]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_spawned_ranks_of_torchdoctor_run(env: dict[str, str], tmp_path: Path, method: str) -> None:
    # mp.spawn ranks are probed once they call init_process_group, into the launcher's run
    # directory; the launcher's own DataLoader-free process is probed as usual. A forked rank
    # starts a probe of its own over its parent's hooks, switched off in the fork (the
    # silent checks' patches once failed there: "training telemetry is off").
    import subprocess

    argv = td_run(
        script("dist_job.py"), "--spawn", "2", "--port", str(free_port()), "--start-method", method
    )
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert not internal_errors(proc.stderr), proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"rank {r} done after 4 steps" for r in (0, 1)]
    job_dir = _one_job_dir(tmp_path)
    for rank, d in enumerate(rank_dirs(job_dir, 2)):
        meta = rundir.read_meta(d)
        assert (meta["rank"], meta["world_size"], meta["status"]) == (rank, 2, "finished")
    rows = query(job_dir, "SELECT rank, count(*) AS n FROM python.steps GROUP BY rank ORDER BY 1")
    assert rows == [{"rank": 0, "n": 4}, {"rank": 1, "n": 4}]
    # Their collectives too: per step DDP's gradient all-reduce and the script's own.
    sql = "SELECT rank, count(*) AS n FROM python.collectives WHERE op = 'all_reduce' GROUP BY 1"
    rows = query(job_dir, sql + " ORDER BY 1")
    assert rows == [{"rank": 0, "n": 8}, {"rank": 1, "n": 8}]
    # The launcher trained nowhere itself: its summary names its ranks, not "no step seen".
    assert "no training step was seen" not in proc.stderr
    assert "    rank 0: 4 steps, " in proc.stderr and "    rank 1: 4 steps, " in proc.stderr
    assert f"the job judged as one: torchdoctor diagnoses {job_dir}" in proc.stderr


def test_ranks_that_name_themselves_share_a_run_dir(
    job: Job, env: dict[str, str], tmp_path: Path
) -> None:
    # Rank and world size given to init_process_group, one --run-dir for both: each rank
    # starts as a plain process and moves into RUN_DIR/rank<N> when init_process_group
    # returns.
    shared = tmp_path / "shared"
    port = str(free_port())
    for rank in (0, 1):
        argv = [sys.executable, script("dist_job.py"), "--rank", str(rank), "--world", "2"]
        job.start(
            [*argv, "--port", port],
            {"TORCHDOCTOR": "1", "TORCHDOCTOR_QUIET": "1", "TORCHDOCTOR_RUN_DIR": str(shared)},
        )
    assert job.wait() == [0, 0], job.output()
    assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == ["rank0", "rank1", "tables"]
    assert not (shared / "meta.json").exists()
    for rank, d in enumerate(rank_dirs(shared, 2)):
        meta = rundir.read_meta(d)
        assert (meta["rank"], meta["world_size"]) == (rank, 2)
        assert meta["job"] == f"tcp://127.0.0.1:{port}"
    rows = query(shared, "SELECT rank, count(*) AS n FROM python.steps GROUP BY rank")
    assert sorted(r["rank"] for r in rows) == [0, 1] and {r["n"] for r in rows} == {4}
