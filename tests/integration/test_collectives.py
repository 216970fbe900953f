"""python.collectives on real 2-rank gloo DDP jobs under torchrun: DDP's own gradient
all-reduces and the script's are recorded on every rank, and they are on disk when a rank dies
of the collective it was in: gloo's SIGABRT on a mismatched all_reduce, the launcher's or a
user's SIGTERM. One job per way of dying and per kernel (the Python one, and the C++ one that
`make test` builds and that is used wherever it is built), shared by its assertions."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, script, site_of, strip_ours, td_run, wait_for
from launchers import Job, torchrun_argv
from recording import query, td

from torchdoctor import native
from torchdoctor.store import rundir
from torchdoctor.store.appender import records

pytestmark = pytest.mark.slow

BACKWARD = site_of("dist_job.py", "loss.backward()")  # DDP's Reducer all-reduces here
OWN = site_of("dist_job.py", "dist.all_reduce(report)")  # the script's own
SQL = (
    "SELECT rank, step, seq, op, shapes, dtype, bytes, state, site, duration"
    " FROM python.collectives"
)


KERNELS = ["native", "python"]
_TIMES = re.compile(r"\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")  # a log line's time and pid


def _env(base: Path, sockets: Path, kernel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(TORCHDOCTOR="1", TORCHDOCTOR_QUIET="1", OMP_NUM_THREADS="1")
    env.update(TORCHDOCTOR_NATIVE="1" if kernel == "native" else "0")
    env.update(TORCHDOCTOR_SOCKET_DIR=str(sockets / "s"), TORCHDOCTOR_RUN_DIR=str(base / "job"))
    return env


def _kernel(request: pytest.FixtureRequest) -> str:
    kernel: str = request.param
    if kernel == "native":  # `make test` builds it: a missing one is a failure there
        assert native.built() is not None, (
            "the C++ kernel is not built: python -m torchdoctor.native"
        )
    return kernel


def _rows(job_dir: Path) -> dict[int, list[dict[str, Any]]]:
    # read here, as `torchdoctor query JOB_DIR SQL --format json` prints it (tests/recording.py)
    by_rank: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for row in query(job_dir, SQL + " ORDER BY rank, seq"):
        by_rank[row["rank"]].append(row)
    return by_rank


@pytest.fixture(scope="module", params=KERNELS)
def mismatch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """At step 2 rank 1 all-reduces 64 values, rank 0 one: gloo aborts a rank (SIGABRT) and
    torchrun ends the other (SIGTERM)."""
    kernel = _kernel(request)
    base = tmp_path_factory.mktemp("mismatch")
    sockets = Path(tempfile.mkdtemp(prefix="td-"))  # short: Unix socket paths are limited
    job = Job(base, _env(base, sockets, kernel))
    try:
        job.start(torchrun_argv(2, script("dist_job.py"), "--mismatch", "1"))
        assert job.wait(180) != [0], job.output()
        yield base / "job", kernel
    finally:
        job.end()
        shutil.rmtree(sockets, ignore_errors=True)


def _rank1_asleep_rank0_waiting(job: Job, base: Path) -> str:
    """Start dist_job.py --wait 1: at step 2 rank 1 sleeps before its all_reduce and rank 0
    waits in it. Rank 1's pid once both are there."""
    job.start(torchrun_argv(2, script("dist_job.py"), "--wait", "1"))
    marker = base / "waiting1"
    wait_for(lambda: marker.exists() and marker.read_text(), 180, "rank 1 waiting")
    log = base / "job" / "rank0" / "tables" / "collectives.log"

    def rank0_in_its_third_all_reduce() -> bool:
        lines = log.read_text().splitlines() if log.exists() else []
        return sum(line.startswith("I ") and OWN + '"' in line for line in lines) >= 3

    wait_for(rank0_in_its_third_all_reduce, 180, "rank 0 in the all_reduce rank 1 skips")
    return marker.read_text()


def test_sigterm_ends_a_rank_waiting_in_a_collective(tmp_path: Path) -> None:
    """Rank 0 waits in gloo (C++, no Python runs on its main thread) for a rank that sleeps:
    SIGTERM ends it at once without torchdoctor, and within the signal watcher's grace
    second with it (before, only when the collective returned), its ending saved."""
    sockets = Path(tempfile.mkdtemp(prefix="td-"))
    job = Job(tmp_path, _env(tmp_path, sockets, "python"))
    try:
        _rank1_asleep_rank0_waiting(job, tmp_path)
        rank0 = tmp_path / "job" / "rank0"
        pid = rundir.read_meta(rank0)["pid"]
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _alive(pid), 20, "rank 0 to end")  # rank 1 sleeps for 600 s
        meta = rundir.read_meta(rank0)
        assert (meta["status"], meta["signal"], meta["steps"]) == ("terminated", "SIGTERM", 3)
        assert job.wait(60) != [0]  # torchrun then stops rank 1
        assert f"exitcode  : -15 (pid: {pid})" in job.output()  # the signal's own status
        rows = _rows(tmp_path / "job")
        assert (rows[0][-1]["site"], rows[0][-1]["state"]) == (OWN, "issued")
    finally:
        job.end()
        shutil.rmtree(sockets, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie until torchrun reaps it: ended all the same
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module", params=KERNELS)
def terminated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """At step 2 rank 1 stops before its all_reduce; the test sends it SIGTERM."""
    kernel = _kernel(request)
    base = tmp_path_factory.mktemp("sigterm")
    sockets = Path(tempfile.mkdtemp(prefix="td-"))  # short: Unix socket paths are limited
    job = Job(base, _env(base, sockets, kernel))
    try:
        pid = _rank1_asleep_rank0_waiting(job, base)
        # Rank 1 sleeps between two calls: its calls are seen done, by a live query at once
        # and on disk by the spill thread's next second, with no call or step of its own.
        sql = "SELECT state FROM python.collectives"
        live = cli(pid, "query", sql, "--format", "json", env=_env(base, sockets, kernel))
        assert live.returncode == 0, live.stderr
        assert {r["state"] for r in json.loads(live.stdout)} == {"completed"}, live.stdout
        ended = base / "job" / "rank1" / "tables" / "collectives.log"

        def all_ended() -> bool:
            lines = records(ended.read_bytes()).decode().splitlines()
            return sum(x.startswith("I ") for x in lines) == sum(x.startswith("E ") for x in lines)

        wait_for(all_ended, 30, "rank 1's calls ended on disk")
        os.kill(int(pid), signal.SIGTERM)
        job.wait(180)
        yield base / "job"
    finally:
        job.end()
        shutil.rmtree(sockets, ignore_errors=True)


def test_ddp_and_script_collectives_on_every_rank(mismatch: tuple[Path, str]) -> None:
    job_dir, kernel = mismatch
    rows = _rows(job_dir)
    for rank in (0, 1):
        mine = rows[rank]
        assert [r["seq"] for r in mine] == list(range(len(mine)))  # none missing
        ddp = [r for r in mine if r["site"] == BACKWARD and r["op"] == "all_reduce"]
        own = [r for r in mine if r["site"] == OWN]
        # steps 0-2 each: DDP's gradient bucket (65 float32 values), then the script's
        assert [(r["step"], r["shapes"], r["dtype"], r["bytes"]) for r in ddp] == [
            (s, "[[65]]", "float32", 260) for s in range(3)
        ]
        if kernel == "native":
            # gloo completes a call's future when it is done: its end is on disk at once,
            # with how long it took
            assert {r["state"] for r in ddp} == {"completed"}
            assert all(0 < r["duration"] < 60 for r in ddp), ddp
        else:
            # The Python kernel sees a completion by polling the work (the spill thread's
            # second, mostly): in a job that aborts within its first second, the calls before
            # the fatal one may not be marked done on disk yet, and their duration is not
            # known. The terminated job below checks that they end.
            assert {r["state"] for r in ddp} <= {"completed", "issued"}
            assert {r["duration"] for r in ddp} == {None}
        assert [r["step"] for r in own] == [1, 2, 3]
    # Up to the fatal call the ranks line up: the same op and shapes at each seq.
    fatal = len(rows[0]) - 1
    assert len(rows[1]) - 1 == fatal
    for a, b in zip(rows[0][:fatal], rows[1][:fatal], strict=True):
        assert (a["op"], a["shapes"]) == (b["op"], b["shapes"])


def test_the_fatal_collective_is_on_disk(mismatch: tuple[Path, str]) -> None:
    job_dir, _kernel = mismatch
    rows = _rows(job_dir)
    last = {rank: rows[rank][-1] for rank in (0, 1)}
    assert {r["site"] for r in last.values()} == {OWN}
    assert (last[0]["shapes"], last[1]["shapes"]) == ("[[]]", "[[64]]")
    metas = {rank: rundir.read_meta(job_dir / f"rank{rank}") for rank in (0, 1)}
    aborted = [r for r, m in metas.items() if m["status"] == "crashed"]
    assert len(aborted) == 1, metas
    (rank,) = aborted
    assert metas[rank]["signal"] == "SIGABRT" and metas[rank]["inferred"] is True
    assert "Aborted" in (job_dir / f"rank{rank}" / rundir.FATAL_FILE).read_text()
    assert last[rank]["state"] == "issued"  # the call it died in
    other = metas[1 - rank]
    assert (other["status"], other.get("signal")) in {("terminated", "SIGTERM"), ("failed", None)}


def test_a_terminated_rank_leaves_its_record(terminated: Path) -> None:
    meta = rundir.read_meta(terminated / "rank1")
    assert (meta["status"], meta["signal"], meta["steps"]) == ("terminated", "SIGTERM", 3)
    rows = _rows(terminated)
    # rank 1 stopped after step 2's gradient all-reduce; rank 0 went on into its all_reduce
    assert (rows[1][-1]["site"], rows[1][-1]["step"]) == (BACKWARD, 2)
    assert rows[0][-1]["site"] == OWN and rows[0][-1]["seq"] == len(rows[1])
    assert rows[0][-1]["state"] in ("issued", "failed")


def test_works_held_stay_within_their_bytes(launch) -> None:  # type: ignore[no-untyped-def]
    # The Python kernel's bound. A work keeps its tensors alive until it is polled; the
    # training thread polls once the works held pass 256 MiB, so a script that drops each
    # 16 MiB tensor at once keeps at most 16 more (the spill thread's second may poll sooner;
    # with the bound lifted, 26 and 27 of the 40 stayed alive in two tries). The C++ kernel
    # holds no work of a gloo call on CPU tensors: it ends when its future completes.
    run = launch(td_run("--quiet", script("dist_held.py"), "40"), {"TORCHDOCTOR_NATIVE": "0"})
    assert run.wait(120) == 0, run.output()
    most = int(run.stdout().split("most alive ")[1].split()[0])
    assert most <= 17, run.output()


def test_both_kernels_record_the_same_rows(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Most of torch.distributed's ops, on the default group and a subgroup, point-to-point
    # both ways: the C++ kernel's rows are the Python kernel's, and it knows the durations of
    # the calls whose future gloo completes (all but send and recv, which are polled).
    sql = (
        'SELECT rank, step, "group", seq, op, shapes, dtype, bytes, peer, state, site, duration'
        ' FROM python.collectives ORDER BY rank, "group", op, seq'
    )
    rows = {}
    for kernel in KERNELS:
        run_dir = tmp_path / kernel
        argv = td_run("--quiet", "--run-dir", str(run_dir), script("dist_ops.py"))
        run = launch(argv, {"TORCHDOCTOR_NATIVE": "1" if kernel == "native" else "0"})
        assert run.wait(120) == 0, run.output()
        rows[kernel] = query(run_dir, sql)
    timed = {r["op"] for r in rows["native"] if r.pop("duration") is not None}
    assert {r.pop("duration") for r in rows["python"]} == {None}
    assert rows["native"] == rows["python"]
    ops = {r["op"] for r in rows["native"]}
    assert timed == ops - {"send", "recv"}
    assert {"all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter"} <= ops
    assert {r["state"] for r in rows["native"]} == {"completed"}
    assert len({r["group"] for r in rows["native"]}) == 2


def test_a_compiled_ddp_model_prints_the_same_and_its_break_is_the_users(tmp_path: Path) -> None:
    # torch warns once a compiled module meets global module hooks: torchdoctor's (the module
    # tracer's) come off at torch.compile, so every rank prints what it prints plain; Dynamo's
    # graph break inside DDP's forward is named at the script's line, not in DDP's code.
    sockets = Path(tempfile.mkdtemp(prefix="td-"))
    outputs = {}
    try:
        for way in ("plain", "probed"):
            env = _env(tmp_path / way, sockets, "native")
            if way == "plain":
                env = {k: v for k, v in env.items() if not k.startswith("TORCHDOCTOR")}
            job = Job(tmp_path, env)
            try:
                job.start(torchrun_argv(2, script("dist_compiled.py")))
                assert job.wait(240) == [0], job.output()
                outputs[way] = job.logs[0].read_text()
            finally:
                job.end()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    # ranks interleave their lines: compared as sets, torchrun's and torch's times and pids out
    probed, plain = (
        sorted(set(_TIMES.sub("", strip_ours(outputs[w])).splitlines()) - {""})
        for w in ("probed", "plain")
    )
    assert probed == plain, outputs["probed"]
    assert "global hooks" not in outputs["probed"]
    out = td("diagnoses", tmp_path / "probed" / "job", "--format", "json")
    assert out.returncode == 0, out.stderr
    breaks = [f for f in json.loads(out.stdout) if f["kind"] == "graph_break"]
    assert breaks and {f["location"] for f in breaks} == {site_of("dist_compiled.py", ".item()")}
