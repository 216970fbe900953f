"""A distributed job as one patient: real gloo jobs under torchrun (2 and 4 ranks, one or two
"nodes" with their own socket directories), the `cluster` verbs from one rank's endpoint, and
each job-level diagnosis on a buggy job and on the job with every fix.

A torchrun job costs tens of seconds on two cores, so each job serves several assertions: the
stuck job runs on two "nodes" and is asked live from both, then its stuck rank is killed with
SIGKILL; one job has both an uneven batch count and a straggler; the job with every fix also
has ranks that exit while rank 0 still writes its checkpoint. Every finding is awaited, and
every job is ended by its fixture, which checks that none of its processes survives.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
from helpers import script, wait_for
from jobs import Job

pytestmark = pytest.mark.slow

HANG = 3.0  # --hang-timeout of the ranks; gloo's own timeout is 600 s
SCRIPT = script("dist_cluster.py")
REPLICAS = script("dist_replicas.py")  # TrainCheck's distributed cases


def line_of(text: str, after: str = "") -> str:
    """`dist_cluster.py:N` of the first line that contains `text` (after the line with `after`)."""
    return f"dist_cluster.py:{helpers.line_of('dist_cluster.py', text, after)}"


# The read that never returns: a loop of two lines, sampled on either (mostly the sleep).
READ = (
    line_of('while not os.path.exists("stop")', after="def load_batch"),
    line_of("time.sleep(0.05)", after="def load_batch"),
)
RAISE = line_of("raise ValueError(")
UPLOAD = (
    line_of('while not os.path.exists("stop")', after="def upload_logs"),
    line_of("time.sleep(0.05)", after="def upload_logs"),
)
BACKWARD = line_of("loss.backward()")
LOGGED = line_of("dist.all_reduce(logged)")
AFTER_LOOP = {
    "barrier": line_of("dist.barrier()"),
    "all_reduce": line_of("dist.all_reduce(total)"),
    "broadcast": line_of("dist.broadcast_object_list(state, src=0)"),
}


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    started: list[Job] = []

    def start(*args: str, nproc: int = 2, name: str = "a", path: str = SCRIPT, **kw: Any) -> Job:
        root = tmp_path / name
        root.mkdir()
        env = {"TORCHDOCTOR_HANG_TIMEOUT": str(HANG), **kw.pop("env", {})}
        job = Job(root, [path, *args], nproc, env=env, **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()


def pid_of(listed: list[dict[str, Any]], rank: int) -> str:
    return str(next(r["pid"] for r in listed if r["rank"] == rank))


def diagnoses(
    job: Job, pid: str, kind: str, node: int = 0, here: bool = False
) -> list[dict[str, Any]]:
    """`torchdoctor PID diagnoses` of `kind` (here=True: the CLI in this process, for polls)."""
    out = job.cli(pid, "diagnoses", "--format", "json", node=node, here=here)
    if out.returncode != 0:
        return []
    return [d for d in json.loads(out.stdout) if d["kind"] == kind]


def wait_finding(
    job: Job, pid: str, kind: str, node: int = 0, timeout: float = 60, step: int | None = None
) -> Any:
    """The first finding of `kind` (at `step`: a machine loaded enough to stall a rank for the
    3 s hang timeout may give an earlier one, which is not what the test is about)."""

    def found() -> Any:
        job.check_running()
        found = diagnoses(job, pid, kind, node, here=True)
        return [d for d in found if step is None or d["step"] == step]

    return wait_for(found, timeout, f"{kind} on process {pid}", interval=0.1)[0]


def wait_hang(job: Job, pid: str, step: int, timeout: float = 60, category: str = "") -> Any:
    def found() -> Any:
        job.check_running()
        hangs = [d for d in diagnoses(job, pid, "hang", here=True) if d["step"] == step]
        return [d for d in hangs if d["evidence"]["category"] == category or not category]

    return wait_for(found, timeout, f"the hang at step {step} on process {pid}", interval=0.1)[0]


def saved(job: Job) -> list[dict[str, Any]]:
    """`torchdoctor diagnoses JOB_DIR` through the CLI's main() here (it only reads the job
    directory; the node-0 copy below is read by a real process)."""
    out = job.cli("diagnoses", str(job.job_dir), "--format", "json", here=True)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def above_info(records: list[dict[str, Any]]) -> list[str]:
    return [f"{r['kind']}: {r['summary']}" for r in records if r["severity"] != "info"]


def test_a_rank_stuck_in_its_read_on_another_node_then_killed(jobs: Callable[..., Job]) -> None:
    # Two torchrun agents (--nnodes=2, one rendezvous endpoint) of two ranks each, each "node"
    # with its own socket directory: a rank finds the other node's ranks only through the
    # job's c10d store and TCP. Node 0 serves no TCP, node 1 does: from node 0 every rank is
    # reachable (ranks 2, 3 over TCP); from node 1, ranks 0, 1 are unreachable and say why.
    # Rank 3 (node 1) never returns from its read at step 5.
    job = jobs("stuck", nproc=2, nodes=2, listen=(False, True))
    listed = job.wait_ranks(4)
    assert [(r["rank"], r["via"]) for r in listed] == [
        (0, "unix"), (1, "unix"), (2, "tcp"), (3, "tcp")
    ]  # fmt: skip
    assert not list(job.socket_dir(0).glob(f"{pid_of(listed, 3)}.*"))
    found = wait_finding(job, pid_of(listed, 0), "missing_rank", step=5)
    assert found["rank"] == 3 and found["location"].endswith(READ), found
    ev = found["evidence"]
    assert ev["op"] == "all_reduce" and ev["waiting"] == [0, 1, 2]
    assert ev["collective"]["site"].endswith(BACKWARD)  # DDP's gradient all-reduce
    assert ev["missing"]["3"]["category"] == "user_code"
    assert any(f["func"] == "load_batch" for f in ev["missing"]["3"]["stack"])
    # Named long before gloo's own 600 s timeout (after the hang timeout and a state of rank 3
    # read after it: a few seconds, more on a loaded machine).
    assert ev["waited"] < 60, ev["waited"]
    assert f"Ranks 0-2 wait in all_reduce #{ev['seq']}" in found["summary"]
    assert "rank 3 is stuck in your own code in load_batch()" in found["summary"]
    # Rank 0's own hang: it waits in DDP's all-reduce (inside loss.backward()), which its
    # pending collective tells apart from its own code.
    hang = wait_hang(job, pid_of(listed, 0), step=5)
    assert hang["evidence"]["category"] == "collective", hang
    assert hang["location"].endswith(BACKWARD), hang
    assert f"waits in collective all_reduce #{ev['seq']}, issued at" in hang["summary"]
    assert "cluster diagnoses" in hang["summary"] and "your own code" not in hang["summary"]
    # The stuck rank itself says so too, from its own node (where ranks 0, 1 are unreachable).
    mine = wait_finding(job, pid_of(listed, 3), "missing_rank", node=1, step=5)
    assert mine["rank"] == 3 and mine["location"] == found["location"]

    out = job.cli("cluster", "backtrace")
    assert out.returncode == 0, out.stderr
    assert "ranks 0-2: main thread" in out.stdout and "rank 3: main thread" in out.stdout
    rank3 = out.stdout.split("rank 3: main thread")[1]
    assert "load_batch" in rank3 and "dist_cluster.py" in rank3

    rows = job.json("cluster", "query", "SELECT count(*) AS steps FROM python.steps")
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert {r["rank"]: r["steps"] for r in rows}[3] == 5

    records = job.json("cluster", "diagnoses")
    held = [r for r in records if r["kind"] == "missing_rank" and r["step"] == 5]
    assert len(held) == 1 and held[0]["job"] and len(held[0]["found_by"]) >= 2
    # The four ranks read one Samples dataset without a DistributedSampler: every rank is given
    # the same batches, told from their digests across both nodes.
    same = [r for r in records if r["kind"] == "same_batches"]
    assert same and same[0]["evidence"]["ranks"] == [0, 1, 2, 3], records
    assert "samples with SequentialSampler, not a DistributedSampler" in same[0]["summary"]

    def with_rank3_hang() -> str | None:  # rank 3's own hang may come a pass after the rest
        text = job.cli("cluster", "diagnoses").stdout
        return text if "rank 3: [error] hang" in text else None

    text = wait_for(with_rank3_hang, 60, "rank 3's hang in `cluster diagnoses`", interval=0.5)
    assert "job (found by ranks " in text and "missing_rank at step 5" in text
    assert text.count("missing_rank at step 5") == 1 and "rank 3: [error] hang" in text

    other = job.json("cluster", "list", node=1)["ranks"]
    assert [(r["status"], r["via"]) for r in other[2:]] == [("ok", "unix")] * 2
    assert [r["status"] for r in other[:2]] == ["unreachable"] * 2
    assert "serving no TCP endpoint" in other[0]["reason"]
    out = job.cli("cluster", "query", "SELECT 1 AS one", node=1)
    assert out.returncode == 0 and "rank 0 unreachable" in out.stderr

    # The user kills the rank that holds the job up; the others lose their peer and end.
    os.kill(int(pid_of(listed, 3)), signal.SIGKILL)
    assert any(job.wait()), job.log()
    records = saved(job)
    held = [r for r in records if r["kind"] == "missing_rank" and r["step"] == 5]
    assert {r["rank"] for r in held} == {3}, records
    died = [r for r in records if r["kind"] == "rank_died"]
    assert len(died) == 1, records
    d = died[0]
    assert d["rank"] == 3 and "Rank 3 went first: killed by SIGKILL" in d["summary"], d
    assert d["evidence"]["status"] == "killed" and "OOM" not in d["summary"]
    waited = d["evidence"]["others"]["0"]["collective"]
    assert waited["op"] == "all_reduce" and waited["seq"] == ev["seq"], d
    assert f"in all_reduce #{ev['seq']}" in d["summary"]
    # Node 0's own ranks alone (its job directory, had each node written its own): they only
    # lost a peer or were stopped by their agent; the rank that went first is not among them.
    node0 = job.root / "node0-job"
    for rank in (0, 1):
        shutil.copytree(job.job_dir / f"rank{rank}", node0 / f"rank{rank}")
    out = job.cli("diagnoses", str(node0), "--format", "json")
    assert out.returncode == 0 and "rank 2 is missing (world size 4)" in out.stderr, out.stderr
    died = [r for r in json.loads(out.stdout) if r["kind"] == "rank_died" and r.get("job")]
    fresh = [r for r in died if r["evidence"].get("elsewhere")]
    assert fresh and fresh[0]["evidence"]["absent"] == "2,3", died
    assert "Ranks 2,3 of the 4 are not in this record" in fresh[0]["summary"]


def test_uneven_batch_counts_a_straggler_and_a_drifted_replica(jobs: Callable[..., Job]) -> None:
    # One job, three bugs of the last rank: it loads its batches 40 ms slower (a straggler),
    # it changes a weight of its own copy of the model at step 2 (its replica drifts), and it
    # has one batch fewer without a DistributedSampler, so it leaves its loop (and writes its
    # checkpoint) while rank 0 waits in the all-reduce of its extra step.
    job = jobs("uneven,straggler,drift")
    listed = job.wait_ranks(2)
    drift = wait_finding(job, pid_of(listed, 0), "replica_drift")
    assert drift["rank"] == 1 and drift["location"] == "0.weight", drift
    assert drift["evidence"]["ranks"] == [1] and drift["step"] == 4  # checked after 1, 2, 4 steps
    assert "changes parameters on rank 1 only" in drift["fix"].splitlines()[0]
    assert "after 4 steps rank 1 holds another copy than rank 0" in drift["summary"]
    found = wait_finding(job, pid_of(listed, 0), "uneven_batches")
    assert found["rank"] == 1 and found["location"].endswith(BACKWARD)
    assert found["evidence"]["steps"] == {"0": 30, "1": 30}
    assert "Rank 1 left its training loop after 30 steps" in found["summary"]
    assert "save_checkpoint()" in found["summary"]
    seq = found["evidence"]["seq"]  # not held up by a stuck rank there
    assert not [
        d for d in diagnoses(job, pid_of(listed, 0), "missing_rank") if d["evidence"]["seq"] == seq
    ]
    assert wait_finding(job, pid_of(listed, 1), "uneven_batches")["rank"] == 1

    found = wait_finding(job, pid_of(listed, 0), "straggler")
    assert found["rank"] == 1, found
    ev = found["evidence"]
    assert ev["phase"] == "data_wait" and ev["wait_per_step"] > 0.02
    # The share of the step time the wait takes: 40 ms planted against a few ms of compute,
    # so close to 1 (0.955 seen), never 1 (the rank computes too).
    assert 0.2 < ev["faster"] < 1
    assert "Rank 1 is a straggler" in found["summary"] and "waiting for data" in found["summary"]
    job.stop()
    assert [r["rank"] for r in saved(job) if r["kind"] == "straggler"][:1] == [1]


def test_traincheck_distributed_cases(jobs: Callable[..., Job]) -> None:
    # TrainCheck's seven distributed cases in one job (dist_replicas.py): four replicated
    # models whose copies drift apart, each by another mechanism (the module DDP wraps trained
    # instead of the wrapper; the model cast after wrapping, which loses DDP's gradient hooks;
    # one rank's weight zeroed as by a lost peer-to-peer copy, three cases; gradients clipped by
    # a rank-local norm), a healthy model beside them, then an all_to_all only rank 0 issues.
    job = jobs(path=REPLICAS)
    pid = pid_of(job.wait_ranks(2), 0)

    def four() -> Any:
        job.check_running()
        drifts = diagnoses(job, pid, "replica_drift", here=True)
        found = {d["evidence"]["model"]: d for d in drifts}
        return found if len(found) >= 4 else None

    found = wait_for(four, 60, "four models drifting apart", interval=0.1)
    assert sorted(found) == ["clipped", "moved", "p2p", "unwrapped"], found
    for d in found.values():  # every rank trains on its own batches: apart after one step
        assert (d["rank"], d["step"], d["evidence"]["agreed_at"]) == (1, 1, None), d
        assert d["evidence"]["unwrapped"] is (d["evidence"]["model"] == "unwrapped"), d
    p2p = found["p2p"]
    assert p2p["location"] == "0.weight" and p2p["evidence"]["differ"] == 1, p2p
    unwrapped = found["unwrapped"]
    bypassed = "calls the module that DistributedDataParallel wraps (`unwrapped`)"
    assert bypassed in unwrapped["summary"], unwrapped
    assert unwrapped["fix"].startswith("call the DistributedDataParallel wrapper")
    assert "cast or moved with .to()" in found["moved"]["fix"]
    assert "a norm over rank-local shards" in found["clipped"]["fix"]

    (job.root / "go").touch()  # on to the MoE step
    mismatch = wait_finding(job, pid, "collective_mismatch")
    ranks = mismatch["evidence"]["ranks"]
    assert (ranks["0"]["op"], ranks["1"]["op"]) == ("all_to_all_single", "all_reduce"), ranks
    moe = f"dist_replicas.py:{helpers.line_of('dist_replicas.py', 'dist.all_to_all_single(')}"
    assert mismatch["location"].endswith(moe) and ranks["0"]["site"].endswith(moe), mismatch
    job.stop()
    records = saved(job)
    drifted = sorted(r["evidence"]["model"] for r in records if r["kind"] == "replica_drift")
    assert drifted == ["clipped", "moved", "p2p", "unwrapped"]  # never the healthy one
    checked = job.json(
        "query",
        str(job.job_dir),
        "SELECT DISTINCT rank FROM python.events WHERE kind = 'replica_checksums' "
        "AND json_extract_string(data, '$.model') = 'healthy' "
        "AND json_extract_string(data, '$.step') = '4'",
    )
    assert sorted(r["rank"] for r in checked) == [0, 1]  # compared, and the same


def test_only_rank_0_calls_all_reduce(jobs: Callable[..., Job]) -> None:
    job = jobs("mismatch")
    assert job.wait() != [0]  # gloo pairs the odd all_reduce with DDP's and aborts rank 0
    records = saved(job)
    found = [r for r in records if r["kind"] == "collective_mismatch"]
    assert len(found) == 1, records
    ev = found[0]["evidence"]
    ranks = ev["ranks"]
    assert ranks["0"]["site"].endswith(LOGGED) and ranks["1"]["site"].endswith(BACKWARD)
    assert ranks["0"]["shapes"] != ranks["1"]["shapes"]
    assert found[0]["rank"] == 0 and found[0]["location"].endswith(LOGGED)
    # gloo aborted rank 0 (SIGABRT from its own thread): the job-level view says it went first.
    died = [r for r in records if r["kind"] == "rank_died"]
    assert len(died) == 1 and died[0]["rank"] == 0, records
    assert died[0]["evidence"]["signal"] == "SIGABRT", died[0]


def test_the_job_with_every_fix_has_no_finding(jobs: Callable[..., Job]) -> None:
    # Every fix at once (a read that returns, DistributedSampler, the logged all_reduce on
    # every rank, no slow rank); ranks 1.. exit while rank 0 still writes its checkpoint.
    # The hang timeout long enough that ranks meeting late at start-up on a loaded machine
    # (DDP's first all_gather waits for a rank still importing torch) are no finding.
    job = jobs("all", "--fixed", "--linger0", env={"TORCHDOCTOR_HANG_TIMEOUT": "30"})
    listed = job.wait_ranks(2)
    pid = int(pid_of(listed, 1))

    def gone() -> Any:  # not "nothing listens ... (the process has exited?)": still going
        ranks = job.json("cluster", "list", here=True)["ranks"]
        return ranks if f"process {pid} has exited" in (ranks[1]["reason"] or "") else None

    ranks = wait_for(gone, 60, "rank 1 to exit", interval=0.1)
    assert ranks[1]["status"] == "unreachable"
    assert f"process {pid} has exited" in ranks[1]["reason"]
    assert ranks[0]["status"] == "ok"
    (job.root / "stop").touch()
    assert job.wait() == [0], job.log()
    records = saved(job)
    # Rank 0's own hang in its planted slow checkpoint (if it lasted the timeout) is the only
    # one; a rank late on a loaded machine, with no phase of its own longer, is information.
    planted = [r for r in records if r["kind"] == "hang" and "save_checkpoint()" in r["summary"]]
    assert {r["rank"] for r in planted} <= {0}
    # Not judged here: dataloader_bound, a rank's own reading of its step times, which this
    # job's 10 judged steps of about 7 ms (0.1 ms of data) cannot make stable on a shared
    # machine: one stall of a few hundred ms inside a data fetch made it "56% waiting for
    # data" once in ten runs (its share is a sum over the window, not a per-step median).
    judged = [r for r in records if r not in planted and r["kind"] != "dataloader_bound"]
    assert above_info(judged) == []
    steps = job.json(
        "query",
        str(job.job_dir),
        "SELECT rank, count(*) AS n FROM python.steps GROUP BY rank ORDER BY rank",
    )
    assert [r["n"] for r in steps] == [13, 13]  # 4 * 12 * 2 + 1 samples: 49 a rank
    ops = job.json("query", str(job.job_dir), "SELECT DISTINCT op FROM python.collectives")
    assert {"all_reduce"} <= {r["op"] for r in ops}


def test_a_peer_killed_mid_training(jobs: Callable[..., Job]) -> None:
    # The last rank is killed with SIGKILL at step 5 (as the OOM killer would); rank 0 loses
    # its peer in the gradient all-reduce and torchrun stops the job.
    job = jobs("lost")
    assert job.wait() != [0], job.log()
    [d] = [r for r in saved(job) if r["kind"] == "rank_died"]
    assert d["rank"] == 1 and d["evidence"]["kind"] == "killed", d
    # -9 is "killed": without evidence of memory trouble, no out-of-memory claim.
    # Its place: the line its last stack sample shows when one was taken in that step (a
    # loaded machine may take none), else its last collective.
    assert re.match(
        r"Rank 1 went first: killed by SIGKILL(, last seen in step 4| at step 4, in \w+\(\) at )",
        d["summary"],
    ), d["summary"]
    assert "OOM" not in d["summary"] and any("dmesg" in f for f in d["fix"].splitlines())
    assert d["fix"].splitlines()[0].startswith("read rank 1's own error first")
    assert d["evidence"]["others"]["0"]["collective"]["site"].endswith(BACKWARD), d
    assert "rank 0: " in d["summary"] and "all_reduce #10" in d["summary"]


def test_a_rank_that_raised_but_cannot_exit(jobs: Callable[..., Job]) -> None:
    # The last rank raises at step 5 while its non-daemon uploader thread keeps its process
    # alive: torchrun sees no failure and rank 0 waits in the all-reduce until the process
    # group's 12 s timeout; then torchrun stops the job. (The job waits that timeout out; the
    # findings below are read about 3 s after the raise on an idle machine.)
    job = jobs("raised", "--timeout", "12")
    listed = job.wait_ranks(2)
    found = wait_finding(job, pid_of(listed, 0), "rank_raised")
    assert found["rank"] == 1 and found["location"].endswith(RAISE), found
    assert "Rank 1 raised ValueError: corrupt record in shard 1 at" in found["summary"]
    assert "thread 'uploader' (" in found["summary"]
    assert any(f"{line})" in found["summary"] for line in UPLOAD), found
    assert "rank 0: waiting in all_reduce #10" in found["summary"]
    assert (
        found["fix"].splitlines()[0]
        == "fix rank 1's error first: it is the cause, the others only wait"
    )
    assert "daemon=True" in found["fix"].splitlines()[1]
    assert not diagnoses(job, pid_of(listed, 0), "uneven_batches")  # not a shorter loop
    # Its own hang says so from its side (a loaded machine may have given it an earlier one).
    hang = wait_hang(job, pid_of(listed, 1), step=5, category="exiting")
    assert "'uploader'" in hang["summary"], hang
    assert job.wait() != [0], job.log()
    [d] = [r for r in saved(job) if r["kind"] == "rank_died"]
    assert d["rank"] == 1 and d["location"].endswith(RAISE), d
    assert d["summary"].startswith("Rank 1 failed first: raised ValueError: corrupt record")
    assert "then stayed alive until terminated by SIGTERM" in d["summary"]
    assert "rank 0: timed out waiting in all_reduce #10" in d["summary"]


def test_the_process_group_times_out_before_the_hang_timeout(jobs: Callable[..., Job]) -> None:
    # A hang timeout of 60 s against the group's 20 s: torchdoctor's is taken down to 10 s
    # (half the group's), so the stuck rank is named before the group's collectives fail;
    # afterwards the job directory names it too (rank 0 timed out, then torchrun stopped rank
    # 1): no rank "died first". (The job waits the group's timeout out, so it is short; 20 s
    # leaves 10 s to read the finding live, on a busy machine too.)
    job = jobs("stuck", "--timeout", "20", env={"TORCHDOCTOR_HANG_TIMEOUT": "60"})
    listed = job.wait_ranks(2)
    found = wait_finding(job, pid_of(listed, 0), "missing_rank", step=5)
    assert found["rank"] == 1 and found["location"].endswith(READ), found
    assert 10 <= found["evidence"]["waited"] < 20, found
    assert found["fix"].splitlines()[0].startswith("look at rank 1's line above")
    assert job.wait() != [0], job.log()
    records = saved(job)
    held = [r for r in records if r["kind"] == "missing_rank" and r["step"] == 5]
    assert [r["rank"] for r in held] == [1], records
    assert not [r for r in records if r["kind"] == "rank_died"], records


@pytest.mark.parametrize("end", ["barrier", "all_reduce", "broadcast"])
def test_uneven_data_whatever_the_last_collective(jobs: Callable[..., Job], end: str) -> None:
    # The last rank has a batch fewer and calls `end` after its loop where rank 0 issues its
    # extra step's gradient all-reduce: uneven batches (not a rank-0-only collective), named
    # by the rank that left, the line it called from, and the fixes for uneven data.
    job = jobs("uneven", "--end", end)
    if end == "all_reduce":  # another size: gloo aborts a rank, the job ends
        assert job.wait() != [0], job.log()
        records = saved(job)
    else:  # they wait until the group's timeout: read live, then stop the job
        listed = job.wait_ranks(2)
        wait_finding(job, pid_of(listed, 0), "uneven_batches")
        job.stop()
        records = saved(job)
    [found] = [r for r in records if r["kind"] == "uneven_batches"]
    assert found["rank"] == 1 and found["location"].endswith(BACKWARD), found
    assert found["evidence"]["left"]["1"]["call"]["site"].endswith(AFTER_LOOP[end])
    assert f"Rank 1 left its training loop after 5 steps and called {end}" in found["summary"]
    assert found["fix"].splitlines()[0].startswith("shard the data with DistributedSampler")
    assert not [r for r in records if r["kind"] == "collective_mismatch"], records
    if end == "barrier":  # stopped by the user: every rank at once, no rank "died first"
        [d] = [r for r in records if r["kind"] == "rank_died"]
        assert d["evidence"]["whole"] and d["severity"] == "info", d
