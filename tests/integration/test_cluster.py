"""A distributed job as one patient: real gloo jobs under torchrun (2 and 4 ranks, one or two
"nodes" with their own socket directories), the `cluster` verbs from one rank's endpoint, and
each job-level diagnosis on a buggy job and on its fixed version.

Every job is ended by its fixture, and the test checks that none of its processes survives.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import script, wait_for
from jobs import Job

pytestmark = pytest.mark.slow

HANG = 3.0  # --hang-timeout of the ranks; gloo's own timeout is 600 s
SCRIPT = script("dist_cluster.py")


def line_of(text: str) -> str:
    """`dist_cluster.py:N` of the first line that contains `text`."""
    lines = Path(SCRIPT).read_text().splitlines()
    return f"dist_cluster.py:{next(i for i, line in enumerate(lines, 1) if text in line)}"


READ = line_of("wait_for_stop()  # the read")
BACKWARD = line_of("loss.backward()")
LOGGED = line_of("dist.all_reduce(logged)")


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    started: list[Job] = []

    def start(*args: str, nproc: int = 2, name: str = "a", **kw: Any) -> Job:
        root = tmp_path / name
        root.mkdir()
        env = {"TORCHDOCTOR_HANG_TIMEOUT": str(HANG), **kw.pop("env", {})}
        job = Job(root, [SCRIPT, *args], nproc, env=env, **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()


def pid_of(listed: list[dict[str, Any]], rank: int) -> str:
    return str(next(r["pid"] for r in listed if r["rank"] == rank))


def diagnoses(job: Job, pid: str, kind: str, node: int = 0) -> list[dict[str, Any]]:
    out = job.cli(pid, "diagnoses", "--format", "json", node=node)
    if out.returncode != 0:
        return []
    return [d for d in json.loads(out.stdout) if d["kind"] == kind]


def wait_finding(job: Job, pid: str, kind: str, node: int = 0, timeout: float = 60) -> Any:
    def found() -> Any:
        job.check_running()
        return diagnoses(job, pid, kind, node)

    return wait_for(found, timeout, f"{kind} on process {pid}")[0]


def saved(job: Job) -> list[dict[str, Any]]:
    out = job.cli("diagnoses", str(job.job_dir), "--format", "json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def above_info(records: list[dict[str, Any]]) -> list[str]:
    return [f"{r['kind']}: {r['summary']}" for r in records if r["severity"] != "info"]


def test_a_rank_stuck_in_its_read_is_named_by_every_rank(jobs: Callable[..., Job]) -> None:
    job = jobs("stuck", nproc=4)
    listed = job.wait_ranks(4)
    assert [r["via"] for r in listed] == ["unix"] * 4
    found = wait_finding(job, pid_of(listed, 0), "missing_rank")
    assert found["rank"] == 1 and found["location"].endswith(READ), found
    ev = found["evidence"]
    assert ev["op"] == "all_reduce" and sorted(ev["waiting"]) == ["0", "2", "3"]
    assert ev["waiting"]["0"]["site"].endswith(BACKWARD)  # DDP's gradient all-reduce
    assert ev["missing"]["1"]["category"] == "user_code"
    assert any(f["func"] == "load_batch" for f in ev["missing"]["1"]["stack"])
    # Named within the hang timeout plus a few seconds of the collective being issued, long
    # before gloo's own 600 s timeout.
    assert ev["waited"] < HANG + 6, ev["waited"]
    assert "Ranks 0,2,3 wait in all_reduce" in found["summary"]
    assert "rank 1 is stuck in your own code in wait_for_stop()" in found["summary"]
    # The stuck rank itself says so too.
    mine = wait_finding(job, pid_of(listed, 1), "missing_rank")
    assert mine["rank"] == 1 and mine["location"] == found["location"]

    out = job.cli("cluster", "backtrace")
    assert out.returncode == 0, out.stderr
    assert "ranks 0,2,3: main thread" in out.stdout and "rank 1: main thread" in out.stdout
    rank1 = out.stdout.split("rank 1: main thread")[1]
    assert "load_batch" in rank1 and READ.split(":")[0] in rank1

    rows = job.json("cluster", "query", "SELECT count(*) AS steps FROM python.steps")
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert {r["rank"]: r["steps"] for r in rows}[1] == 5

    records = job.json("cluster", "diagnoses")
    held = [r for r in records if r["kind"] == "missing_rank"]
    assert len(held) == 1 and held[0]["job"] and len(held[0]["found_by"]) >= 2

    text = job.cli("cluster", "diagnoses").stdout
    assert "job (ranks " in text and "missing_rank at step 5" in text
    job.stop()
    kinds = {r["kind"] for r in saved(job)}
    assert "missing_rank" in kinds


def test_a_rank_killed_while_the_others_wait(jobs: Callable[..., Job]) -> None:
    job = jobs("stuck")
    listed = job.wait_ranks(2)
    wait_finding(job, pid_of(listed, 0), "missing_rank")
    os.kill(int(pid_of(listed, 1)), signal.SIGKILL)
    assert job.wait() != [0]
    died = [r for r in saved(job) if r["kind"] == "rank_died"]
    assert len(died) == 1, saved(job)
    d = died[0]
    assert d["rank"] == 1 and "SIGKILL" in d["summary"], d
    assert (
        f"rank 0 was waiting in all_reduce #{d['evidence']['others']['0']['collective']['seq']}"
        in d["summary"]
    )


def test_uneven_batch_counts(jobs: Callable[..., Job]) -> None:
    job = jobs("uneven")
    listed = job.wait_ranks(2)
    found = wait_finding(job, pid_of(listed, 0), "uneven_batches")
    assert found["rank"] == 1 and found["location"].endswith(BACKWARD)
    assert found["evidence"]["steps"] == {"0": 5, "1": 5}
    assert "Rank 1 left its training loop after 5 steps" in found["summary"]
    assert "save_checkpoint()" in found["summary"]
    assert not diagnoses(job, pid_of(listed, 0), "missing_rank")
    assert wait_finding(job, pid_of(listed, 1), "uneven_batches")["rank"] == 1


def test_only_rank_0_calls_all_reduce(jobs: Callable[..., Job]) -> None:
    job = jobs("mismatch")
    assert job.wait() != [0]  # gloo pairs the odd all_reduce with DDP's and the job dies
    records = saved(job)
    found = [r for r in records if r["kind"] == "collective_mismatch"]
    assert len(found) == 1, records
    ev = found[0]["evidence"]
    ranks = ev["ranks"]
    assert ranks["0"]["site"].endswith(LOGGED) and ranks["1"]["site"].endswith(BACKWARD)
    assert ranks["0"]["shapes"] != ranks["1"]["shapes"]
    assert found[0]["rank"] == 0 and found[0]["location"].endswith(LOGGED)
    # gloo aborted rank 0 (SIGABRT in its own thread): the job-level view says who went first.
    died = [r for r in records if r["kind"] == "rank_died"]
    assert died and died[0]["rank"] == 0, records


def test_a_straggler(jobs: Callable[..., Job]) -> None:
    job = jobs("straggler", "--linger", nproc=4)
    listed = job.wait_ranks(4)
    found = wait_finding(job, pid_of(listed, 0), "straggler", timeout=90)
    assert found["rank"] == 3, found
    ev = found["evidence"]
    assert ev["phase"] == "data_wait" and ev["wait_per_step"] > 0.02
    assert 0.2 < ev["faster"] < 0.95
    assert "Rank 3 is a straggler" in found["summary"] and "waiting for data" in found["summary"]
    job.stop()
    assert [r["rank"] for r in saved(job) if r["kind"] == "straggler"][:1] == [3]


@pytest.mark.parametrize("mode", ["stuck", "uneven", "mismatch", "straggler"])
def test_the_fixed_jobs_have_no_finding(jobs: Callable[..., Job], mode: str) -> None:
    job = jobs(mode, "--fixed", nproc=4 if mode == "straggler" else 2)
    assert job.wait() == [0], job.log()
    assert above_info(saved(job)) == []


def test_two_nodes_reach_each_other_over_tcp(jobs: Callable[..., Job]) -> None:
    # Node 0 serves no TCP, node 1 does: from node 0 every rank is reachable (rank 1 over
    # TCP); from node 1, rank 0 is unreachable and says why.
    job = jobs("stuck", nproc=1, nodes=2, listen=(False, True))
    listed = job.wait_ranks(2)
    assert [(r["rank"], r["via"]) for r in listed] == [(0, "unix"), (1, "tcp")]
    found = wait_finding(job, pid_of(listed, 0), "missing_rank")
    assert found["rank"] == 1 and found["location"].endswith(READ)
    out = job.cli("cluster", "backtrace")
    assert "rank 1: main thread" in out.stdout and "load_batch" in out.stdout, out.stderr

    other = job.json("cluster", "list", node=1)["ranks"]
    assert other[1]["via"] == "unix" and other[1]["status"] == "ok"
    assert other[0]["status"] == "unreachable"
    assert "serving no TCP endpoint" in other[0]["reason"]
    out = job.cli("cluster", "query", "SELECT 1 AS one", node=1)
    assert out.returncode == 0 and "rank 0 unreachable" in out.stderr


def test_a_rank_that_exited_is_listed_with_the_reason(jobs: Callable[..., Job]) -> None:
    job = jobs("straggler", "--fixed", "--linger0")
    listed = job.wait_ranks(2)
    pid = int(pid_of(listed, 1))

    def gone() -> Any:
        ranks = job.json("cluster", "list")["ranks"]
        return ranks if "has exited" in (ranks[1]["reason"] or "") else None

    ranks = wait_for(gone, 60, "rank 1 to exit")
    assert f"process {pid} has exited" in ranks[1]["reason"]
    assert ranks[0]["status"] == "ok"
