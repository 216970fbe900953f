"""A job directory of two real ranks (gloo, under `torchdoctor run --run-dir JOB`: each rank
writes JOB/rank<N>) read as one by every verb that reads a saved run; a missing rank and a rank
of another job are named and the rest is read. The verbs run through the CLI's main() in this
process (tests/recording.py): they only read the directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port, script, td_run
from recording import td
from trace_check import check_trace

from torchdoctor.store import rundir

WORLD = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JOB_DIR/rank0 and JOB_DIR/rank1 written by two real processes of one gloo job."""
    import os
    import subprocess

    root = tmp_path_factory.mktemp("job")
    job_dir = root / "job"
    port = str(free_port())
    procs = []
    try:
        for rank in range(WORLD):
            env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
            env.update(
                TORCHDOCTOR_SOCKET_DIR=str(root / "s"),
                OMP_NUM_THREADS="1",
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(WORLD),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            )
            argv = td_run("--quiet", "--run-dir", str(job_dir))
            argv += [script("dist_uneven.py"), "--fixed"]
            procs.append(subprocess.Popen(argv, env=env, cwd=root, stderr=subprocess.PIPE))
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    # Each rank's identity is in its meta.json.
    for rank in range(WORLD):
        meta = rundir.read_meta(job_dir / f"rank{rank}")
        assert (meta["rank"], meta["world_size"], meta["job"]) == (rank, WORLD, f"127.0.0.1:{port}")
    return job_dir


def _json(*args: str) -> Any:
    out = td(*args, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_query_reads_every_rank(job: Path) -> None:
    rows = _json(
        "query", str(job), "SELECT rank, count(*) AS n FROM python.steps GROUP BY rank ORDER BY 1"
    )
    assert rows == [{"rank": 0, "n": 8}, {"rank": 1, "n": 8}]
    # Tables without a rank of their own get it from the directory.
    rows = _json("query", str(job), "SELECT DISTINCT rank FROM python.events ORDER BY 1")
    assert rows == [{"rank": 0}, {"rank": 1}]
    # One rank's directory still works alone.
    rows = _json("query", str(job / "rank1"), "SELECT DISTINCT rank FROM python.steps")
    assert rows == [{"rank": 1}]


def test_tables_diagnoses_and_memory_of_a_job(job: Path) -> None:
    tables = {t["name"]: t for t in _json("tables", str(job))}
    for name, t in tables.items():
        assert "rank" in [c["name"] for c in t["columns"]], name
    assert isinstance(_json("diagnoses", str(job)), list)
    view = _json("memory", str(job))
    assert view["last_step"]["step"] == 7


def test_report_and_export_of_a_job(job: Path, tmp_path: Path) -> None:
    out = td("report", str(job), "--format", "json")
    assert out.returncode == 0, out.stderr
    digest = json.loads(out.stdout)
    assert digest["ranks"] == [0, 1]
    assert digest["rank_times"]["ranks"] == [0, 1]
    assert [s["steps"] for s in digest["rank_times"]["stats"]] == [8, 8]
    assert digest["meta"]["world_size"] == WORLD
    trace = tmp_path / "job.json"
    assert td("export", str(job), "--perfetto", str(trace)).returncode == 0
    doc = json.loads(trace.read_text())
    check_trace(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert td("export", str(job), "--csv", str(tmp_path / "csv")).returncode == 0
    lines = (tmp_path / "csv" / "events.csv").read_text().splitlines()
    assert lines[0].endswith(",rank")
    models = [line for line in lines[1:] if ",model," in line]  # one model seen on each rank
    assert sorted(line.rsplit(",", 1)[1] for line in models) == ["0", "1"]


def test_compare_a_job_with_itself(job: Path) -> None:
    """Per rank and per collective, and nothing differs."""
    r = _json("compare", str(job), str(job))
    assert [row["rank"] for row in r["ranks"]] == [0, 1]
    assert r["straggler"] is None
    ops = {row["op"]: row for row in r["collectives"]}
    assert "all_reduce" in ops
    per_step = ops["all_reduce"]["per_step"]
    assert per_step[0] == per_step[1] >= 1  # the script's all_reduce of its loss
    assert r["curves"]["loss"]["first_difference"] is None
    assert not [s for s in r["settings"] if s["differs"]]


def test_a_missing_rank_and_a_foreign_rank(job: Path, tmp_path: Path) -> None:
    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    # The job said it had three ranks; rank 2 never wrote. Rank 1 belongs to another job.
    for rank in (0, 1):
        meta = rundir.read_meta(copy / f"rank{rank}")
        meta["world_size"] = 3
        rundir.write_meta(copy / f"rank{rank}", meta)
    shutil.copytree(copy / "rank1", copy / "rank3")
    meta = rundir.read_meta(copy / "rank3")
    meta.update(rank=3, job="job-b")
    rundir.write_meta(copy / "rank3", meta)
    out = td("query", str(copy), "SELECT DISTINCT rank FROM python.steps ORDER BY 1")
    assert out.returncode == 0, out.stderr
    assert "rank 2 is missing (world size 3)" in out.stderr
    ours = rundir.read_meta(job / "rank0")["job"]
    assert "rank 3" in out.stderr and f"another job ('job-b', not {ours!r})" in out.stderr
    assert out.stdout.split() == ["rank", "----", "0", "1", "(2", "rows)"]
    for verb in (["diagnoses"], ["memory"], ["tables"], ["report", "--format", "json"]):
        out = td(verb[0], str(copy), *verb[1:])
        assert out.returncode == 0, (verb, out.stderr)
        assert "rank 2 is missing" in out.stderr, verb
