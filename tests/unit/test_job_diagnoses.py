"""The job-level diagnoses as pure functions of several ranks' tables: rows built with the
store's own row types (and, for a job directory, written with its own writers), each
diagnosis on a buggy job and on its fixed version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchdoctor.cluster import loops
from torchdoctor.cluster.gather import RankRecord
from torchdoctor.cluster.saved import findings
from torchdoctor.diagnose import (
    collective_mismatch,
    hang,
    job_kinds,
    job_modules,
    missing_rank,
    rank_died,
    rank_raised,
    replica_drift,
    same_batches,
    straggler,
    uneven_batches,
)
from torchdoctor.diagnose.evidence import decode
from torchdoctor.diagnose.inputs import HangCapture, Inputs, JobInputs, RankBatches, RankView
from torchdoctor.diagnose.record import Diagnosis, Finding
from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.identity import rank_ranges, ranks_text
from torchdoctor.report.cluster import (
    group_own,
    group_stacks,
    merge_findings,
    render_backtrace,
    render_diagnoses,
)
from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import JobRun
from torchdoctor.store.schema import BY_NAME, COLLECTIVES, STEPS
from torchdoctor.store.tables import Spiller, Tables

NOW = 1_800_000_000.0
TRAIN = "/work/project/train.py"
LOOP = (30, 50)  # the training loop's lines in TRAIN
BACKWARD = f"{TRAIN}:40"  # loss.backward(), inside the loop: DDP's all-reduce site
Call = COLLECTIVES.row_type()
Step = STEPS.row_type()


def call(rank: int, seq: int, step: int, t: float, state: str = "completed", **kw: Any) -> tuple:
    values = {
        "step": step,
        "group": "default",
        "seq": seq,
        "op": "all_reduce",
        "shapes": "[[8, 1]]",
        "dtype": "float32",
        "bytes": 32,
        "peer": None,
        "time": t,
        "duration": None if state == "issued" else 0.001,
        "state": state,
        "site": BACKWARD,
        "rank": rank,
    }
    values.update(kw)
    return tuple(Call(**values))


def step_row(rank: int, step: int, t: float, duration: float = 0.05, **phases: float) -> tuple:
    p = {"data_wait": 0.005, "forward": 0.01, "backward": 0.02, "optimizer": 0.005}
    p.update(phases)
    p["other"] = max(0.0, duration - sum(p.values()))
    return tuple(
        Step(
            step=step, time=t, duration=duration, loss=1.0, grad_norm=1.0, lr=0.1,
            allocated=1, max_allocated=1, reserved=1, rss=1, rank=rank, micro_batches=1,
            skipped=False, traced=False, **p,
        )
    )  # fmt: skip


def view(rank: int, calls: list[tuple], steps: int, **kw: Any) -> RankView:
    rows = [step_row(rank, s, NOW - 100 + s) for s in range(steps)]
    return RankView(
        rank=rank,
        steps=Block.from_rows(STEPS, rows),
        collectives=Block.from_rows(COLLECTIVES, calls),
        **kw,
    )


def frame(func: str, line: int, path: str = TRAIN) -> StackFrame:
    return StackFrame(func=func, file=path, lineno=line)


def inputs(ranks: dict[int, RankView], live: bool = True, timeout: float = 5.0) -> Inputs:
    job = JobInputs(
        ranks=ranks,
        world_size=len(ranks),
        now=NOW,
        hang_timeout=timeout,
        live=live,
        loops={TRAIN: [(10, 60), LOOP]},  # an epoch loop around the batch loop
    )
    return Inputs(
        steps=Block.empty(STEPS),
        module_grads=Block.empty(BY_NAME["module_grads"]),
        events=[],
        config=None,
        now=NOW,
        job=job,
    )


def _history(rank: int, upto: int) -> list[tuple]:
    """Collectives #0..upto-1, one per step, all completed."""
    return [call(rank, s, s, NOW - 100 + s) for s in range(upto)]


def _stuck_job(rank1_stack: list[StackFrame], waited: float = 10.0) -> dict[int, RankView]:
    """Ranks 0, 2, 3 wait in all_reduce #5 of step 5; rank 1 issued up to #4."""
    ranks = {}
    for r in (0, 2, 3):
        pending = call(r, 5, 5, NOW - waited, state="issued")
        stack = [
            frame("wait", 99, "/site-packages/torch/distributed/c10d.py"),
            frame("<module>", 40),
        ]
        ranks[r] = view(r, [*_history(r, 5), pending], 5, stack=stack)
    ranks[1] = view(1, _history(1, 5), 5, stack=rank1_stack)
    return ranks


IN_LOAD_BATCH = [frame("load_batch", 22), frame("<module>", 33)]  # called from inside the loop
AFTER_LOOP = [frame("save_checkpoint", 70), frame("<module>", 55)]  # past the batch loop


def test_missing_rank_names_the_rank_its_line_and_the_collective() -> None:
    found = missing_rank.diagnose(inputs(_stuck_job(IN_LOAD_BATCH)))
    assert len(found) == 1
    d = found[0]
    assert d.kind == "missing_rank" and d.severity == "error" and d.job
    assert d.rank == 1 and d.step == 5
    assert d.location is not None and d.location.endswith("train.py:22")
    assert d.evidence.seq == 5 and d.evidence.op == "all_reduce"
    assert d.evidence.waiting == [0, 2, 3]
    assert d.evidence.missing["1"].last_seq == 4
    assert "Ranks 0,2,3 wait in all_reduce #5" in d.summary
    assert "rank 1 is stuck in your own code in load_batch()" in d.summary
    # Not a shorter loop: rank 1 is still inside it.
    assert uneven_batches.diagnose(inputs(_stuck_job(IN_LOAD_BATCH))) == []


def test_no_hold_up_before_the_hang_timeout_or_when_every_rank_arrived() -> None:
    assert missing_rank.diagnose(inputs(_stuck_job(IN_LOAD_BATCH, waited=2.0))) == []
    fixed = _stuck_job(IN_LOAD_BATCH)
    fixed[1] = view(1, [*_history(1, 5), call(1, 5, 5, NOW - 1, state="issued")], 5)
    assert missing_rank.diagnose(inputs(fixed)) == []
    assert uneven_batches.diagnose(inputs(fixed)) == []


def test_a_last_call_still_shown_pending_does_not_hide_the_holdup() -> None:
    # Rank 1 stopped right after #4 (its read never returns): the completion of #4 was not
    # seen, so #4 still reads `issued` on rank 1 (and on rank 2) although every rank issued it.
    ranks = _stuck_job(IN_LOAD_BATCH)
    ranks[1] = view(
        1, [*_history(1, 4), call(1, 4, 4, NOW - 11, state="issued")], 5, stack=IN_LOAD_BATCH
    )
    calls = [c for c in ranks[2].collectives.to_records() if c["seq"] != 4]
    stale = call(2, 4, 4, NOW - 11, state="issued")
    ranks[2] = view(2, [*[tuple(c.values()) for c in calls], stale], 5, stack=ranks[2].stack)
    found = missing_rank.diagnose(inputs(ranks))
    assert [(d.rank, d.evidence.seq) for d in found] == [(1, 5)]
    assert found[0].evidence.waiting == [0, 2, 3]


def test_uneven_batches_when_the_missing_rank_left_its_loop() -> None:
    found = uneven_batches.diagnose(inputs(_stuck_job(AFTER_LOOP)))
    assert len(found) == 1
    d = found[0]
    assert d.kind == "uneven_batches" and d.rank == 1 and d.step == 5
    assert d.evidence.left["1"].steps == 5
    assert "Rank 1 left its training loop after 5 steps" in d.summary
    assert "save_checkpoint()" in d.summary
    assert any("DistributedSampler" in f for f in d.fix)
    assert missing_rank.diagnose(inputs(_stuck_job(AFTER_LOOP))) == []


def test_a_rank_that_finished_while_others_wait_is_uneven_too() -> None:
    ranks = _stuck_job([])
    ranks[1] = view(1, _history(1, 5), 5, status="finished", ended=NOW - 9)
    found = uneven_batches.diagnose(inputs(ranks))
    assert found and "exited" in found[0].summary


def test_collective_mismatch_at_the_first_sequence_number_that_differs() -> None:
    ranks = {r: view(r, _history(r, 7), 7) for r in (0, 1)}
    extra = call(0, 7, 7, NOW - 5, state="issued", shapes="[[1]]", site=f"{TRAIN}:45")
    ranks[0] = view(0, [*_history(0, 7), extra], 7)
    ranks[1] = view(1, [*_history(1, 7), call(1, 7, 7, NOW - 5, state="issued")], 7)
    found = collective_mismatch.diagnose(inputs(ranks))
    assert len(found) == 1
    d = found[0]
    assert d.evidence.seq == 7
    assert d.evidence.ranks["0"].shapes == [[1]]
    assert d.evidence.ranks["1"].shapes == [[8, 1]]
    assert "rank 0 calls all_reduce [[1]] float32 at" in d.summary
    assert d.location is not None and d.location.endswith("train.py:45")
    # Another op at the same seq is a mismatch too; the same calls on every rank are not.
    ranks[0] = view(0, [*_history(0, 7), call(0, 7, 7, NOW, op="broadcast")], 7)
    assert collective_mismatch.diagnose(inputs(ranks))[0].evidence.ranks["0"].op == "broadcast"
    same = {r: view(r, _history(r, 8), 8) for r in (0, 1)}
    assert collective_mismatch.diagnose(inputs(same)) == []
    # A scatter's non-root rank passes no tensor list: no dtype to compare (tensor parallel's
    # distribute_tensor at set-up); another dtype where both name one is still a mismatch.
    for dtypes, found_one in (((None, "float32"), False), (("float16", "float32"), True)):
        scattered = {
            r: view(r, [*_history(r, 7), call(r, 7, 7, NOW, op="scatter", dtype=dtypes[r])], 8)
            for r in (0, 1)
        }
        assert bool(collective_mismatch.diagnose(inputs(scattered))) == found_one


def _straggler_job(
    slow: int | None, world: int = 4, steps: int = 40, explained: bool = True
) -> dict[int, RankView]:
    rng = np.random.default_rng(0)
    ranks = {}
    for r in range(world):
        calls, rows = [], []
        for s in range(steps):
            start = NOW - 100 + s * 0.05
            late = 0.03 if r == slow else float(rng.uniform(0, 0.003))
            calls.append(call(r, s, s, start + 0.01 + late))
            data = 0.035 if r == slow and explained else 0.005
            backward = 0.02 - (late if r == slow else 0.0) + (0.03 if slow is not None else 0.0)
            if not explained:  # the same work everywhere, one rank's clock 30 ms ahead
                backward = 0.02
            rows.append(step_row(r, s, start + 0.05, 0.05, data_wait=data, backward=backward))
        ranks[r] = RankView(
            rank=r,
            steps=Block.from_rows(STEPS, rows),
            collectives=Block.from_rows(COLLECTIVES, calls),
        )
    return ranks


def test_straggler_names_the_rank_its_phase_and_the_time_to_gain() -> None:
    found = straggler.diagnose(inputs(_straggler_job(slow=2)))
    assert len(found) == 1
    d = found[0]
    assert d.kind == "straggler" and d.rank == 2 and d.severity == "warning"
    assert d.evidence.phase == "data_wait"
    assert 0.025 < d.evidence.wait_per_step < 0.031
    assert 0.45 < d.evidence.faster < 0.65
    assert "Rank 2 is a straggler" in d.summary and "waiting for data" in d.summary
    assert straggler.diagnose(inputs(_straggler_job(slow=None))) == []
    # too few steps to tell a slow rank from one descheduled for a while (18 judged after the
    # warm-up): not judged yet; 21 are enough
    assert straggler.diagnose(inputs(_straggler_job(slow=2, steps=20))) == []
    assert straggler.diagnose(inputs(_straggler_job(slow=2, steps=23)))


def test_a_rank_late_with_no_longer_phase_is_information_only() -> None:
    """Last every step, yet none of its phases longer (here: one node's clock ahead; a node
    starved of CPU looks alike), so the finding names it without claiming a cause."""
    [d] = straggler.diagnose(inputs(_straggler_job(slow=2, explained=False)))
    assert d.rank == 2 and d.severity == "info" and d.evidence.phase is None
    assert "Rank 2 arrives last" in d.summary and "none of its phases" in d.summary
    assert "straggler:" not in d.summary and "goes to" not in d.summary


def test_rank_died_names_the_first_to_die_and_what_the_others_were_doing() -> None:
    ranks = {
        0: view(
            0,
            [*_history(0, 5), call(0, 5, 5, NOW - 3, state="issued")],
            5,
            status="terminated",
            signal="SIGTERM",
            ended=NOW - 1,
        ),
        1: view(1, _history(1, 5), 5, status="killed", signal="SIGKILL", ended=NOW - 2),
    }
    found = rank_died.diagnose(inputs(ranks, live=False))
    assert len(found) == 1
    d = found[0]
    assert d.rank == 1 and d.evidence.how == "killed by SIGKILL"
    assert "Rank 1 went first: killed by SIGKILL, last seen in step 4" in d.summary
    assert "rank 0: waiting in all_reduce #5" in d.summary
    assert "then terminated by SIGTERM" in d.summary
    # The dead rank is rank_died's, not a hold-up by a live rank.
    assert missing_rank.diagnose(inputs(ranks, live=False)) == []
    alive = {r: view(r, _history(r, 5), 5) for r in (0, 1)}
    assert rank_died.diagnose(inputs(alive)) == []


def test_loop_ranges_of_a_script(tmp_path: Path) -> None:
    source = tmp_path / "train.py"
    source.write_text(
        "import x\n"
        "for epoch in range(3):\n"
        "    for batch in loader:\n"
        "        step(batch)\n"
        "    evaluate()\n"
        "while True:\n"
        "    break\n"
    )
    assert loops.loop_ranges(str(source)) == [(2, 5), (3, 4), (6, 7)]
    assert loops.loop_ranges(str(tmp_path / "missing.py")) is None
    assert loops.loops_of([str(source), "<stdin>"]) == {str(source): [(2, 5), (3, 4), (6, 7)]}


def test_a_record_merges_answers_and_settles_calls_no_longer_pending() -> None:
    columns = {"steps": list(STEPS.column_names), "collectives": list(COLLECTIVES.column_names)}
    record = RankRecord(1)
    pending = list(call(1, 3, 3, NOW, state="issued"))
    record.update(
        {
            "columns": columns,
            "steps_done": 3,
            "stack": IN_LOAD_BATCH,
            "steps": {"rows": [list(step_row(1, s, NOW + s)) for s in range(3)], "cursor": 3},
            "collectives": {"rows": [list(c) for c in _history(1, 3)], "cursor": 3},
            "current": [pending],
        }
    )
    assert record.cursors == {"steps": 3, "collectives": 3}
    assert record.pending_since() == NOW
    v = record.view()
    assert v.steps_done == 3 and v.collectives.rows == 4 and v.status == "running"
    # The next light answer no longer lists #3 as pending: it completed meanwhile.
    record.update({"columns": columns, "steps_done": 4, "current": [list(call(1, 4, 4, NOW))]})
    assert record.pending_since() is None
    record.lost("nothing listens at /tmp/x.sock (the process has exited?)")
    assert record.view().status == "unreachable" and record.view().stack is None


def _write_rank(job: Path, rank: int, calls: list[tuple], steps: int, meta: dict) -> None:
    run = rundir.create(job / f"rank{rank}")
    tables = Tables()
    for s in range(steps):
        tables["steps"].append(step_row(rank, s, NOW - 100 + s))
    journal = tables["collectives"]  # written through, as the ranks write it
    journal.attach(lambda: run)
    state, duration = COLLECTIVES.index("state"), COLLECTIVES.index("duration")
    for c in calls:
        rid = journal.issue(c)
        if c[state] != "issued":
            journal.end(rid, c[duration], c[state])
    journal.close()
    Spiller(tables, run).stop()
    rundir.write_meta(run, {"pid": 100 + rank, "rank": rank, "world_size": 2, **meta})


def test_a_job_directory_gives_the_same_findings(tmp_path: Path) -> None:
    job = tmp_path / "job"
    _write_rank(
        job,
        0,
        [*_history(0, 5), call(0, 5, 5, NOW - 30, state="failed")],
        5,
        {"status": "failed", "ended": "2027-01-15T08:00:00", "exit_code": 1},
    )
    _write_rank(job, 1, _history(1, 5), 5, {"status": "killed", "signal": "SIGKILL"})
    found = {d.kind: d for d in findings(JobRun(job))}
    assert set(found) == {"rank_died"}
    d = found["rank_died"]
    # Killed without a time, the one own failure: rank 0 exited because its collective failed.
    assert d.rank == 1 and d.evidence.known_by == "only"
    assert "rank 0: failed in all_reduce #5" in d.summary
    rows = JobRun(job).block("collectives")
    assert rows.rows == 11 and json.loads(rows.column("shapes")[0]) == [[8, 1]]


# -- ranks as ranges ---------------------------------------------------------------------------
def test_ranks_read_as_ranges() -> None:
    assert rank_ranges([*range(7), *range(8, 16)]) == "0-6,8-15"
    assert ranks_text([3]) == "rank 3" and ranks_text([2, 3]) == "ranks 2,3"
    assert ranks_text([0, 2, 3, 4]) == "ranks 0,2-4"
    scattered = list(range(0, 40, 2))  # 20 runs: the first ones and how many in all
    assert rank_ranges(scattered) == "0,2,4,6,8,10,12,14,... (20 ranks)"


# -- a missing rank is judged on a fresh state (the flaky two-node test) ---------------------
def test_a_missing_rank_is_judged_only_on_a_state_read_after_the_wait() -> None:
    """Its last state read before the others had waited the threshold may show it anywhere in
    its previous step (live, gathers come every few seconds, later under load): judged then,
    rank 1 would be named stuck at the wrong line, once and for good. It waits a gather."""
    ranks = _stuck_job(IN_LOAD_BATCH, waited=10.0)
    in_backward = [frame("backward", 40)]  # where rank 1 stood in step 4
    ranks[1] = view(1, _history(1, 5), 5, stack=in_backward, clock=NOW - 8.0)
    assert missing_rank.diagnose(inputs(ranks)) == []
    ranks[1] = view(1, _history(1, 5), 5, stack=IN_LOAD_BATCH, clock=NOW)
    [d] = missing_rank.diagnose(inputs(ranks))
    assert d.location is not None and d.location.endswith("train.py:22")


# -- how a job ended ------------------------------------------------------------------------
def raised(error: str, t: float, line: int = 40, step: int = 5) -> dict[str, Any]:
    kind, _, message = error.partition(": ")
    return {"exception": kind, "message": message, "file": TRAIN, "line": line, "step": step,
            "time": t}  # fmt: skip


LOST = "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:5"
TIMED_OUT = "RuntimeError: [../gloo/unbound_buffer.cc:78] Timed out waiting 20000ms for recv"


def test_a_rank_killed_mid_training_went_first_and_its_peer_only_lost_it() -> None:
    ranks = {
        0: view(0, [*_history(0, 5), call(0, 5, 5, NOW - 3, state="failed")], 5,
                status="failed", exit_code=1, ended=NOW - 2, raised=raised(LOST, NOW - 2)),
        1: view(1, _history(1, 5), 5, status="killed"),  # no time: SIGKILL leaves none
    }  # fmt: skip
    [d] = rank_died.diagnose(inputs(ranks, live=False))
    assert d.rank == 1 and d.evidence.kind == "killed" and d.evidence.known_by == "only"
    assert d.summary.startswith("Rank 1 went first: killed by SIGKILL, last seen in step 4")
    assert "rank 0: lost a peer in all_reduce #5" in d.summary
    assert "Connection closed by peer" in d.summary and "pair.cc" not in d.summary
    assert "OOM" not in d.summary  # no evidence of it
    assert any("dmesg" in f for f in d.fix)
    # torchrun's exit code -9 is SIGKILL too; an own memory finding makes the OOM killer likely.
    ranks[1] = view(1, _history(1, 5), 5, status="failed", exit_code=-9, kinds=("memory_leak",))
    [d] = rank_died.diagnose(inputs(ranks, live=False))
    assert d.rank == 1 and "killed by SIGKILL; its own memory_leak finding" in d.summary
    assert "OOM killer is likely" in d.summary


def test_died_first_only_from_real_times() -> None:
    # Rank 1 raised at NOW - 30; rank 0's own error came later: rank 1 failed first, however
    # its last rows compare.
    ranks = {
        0: view(0, _history(0, 5), 5, status="failed", ended=NOW - 5,
                raised=raised("KeyError: 'label'", NOW - 5)),
        1: view(1, _history(1, 5), 5, status="failed", ended=NOW - 29,
                raised=raised("ValueError: bad shard", NOW - 30, line=22)),
    }  # fmt: skip
    [d] = rank_died.diagnose(inputs(ranks, live=False))
    assert d.rank == 1 and d.evidence.known_by == "time"
    assert "Rank 1 failed first: raised ValueError: bad shard at" in d.summary
    assert "train.py:22 at step 5, 25.0 s before the next rank ended" in d.summary


def test_a_job_stopped_as_a_whole_says_so_and_names_the_stuck_rank() -> None:
    """The user stops the hung job: every rank terminated at once (or killed at once, without a
    time). No rank died first; the journals and rank 1's own hang stack name the rank that
    held the others up."""
    ranks = _stuck_job(IN_LOAD_BATCH)
    for r, v in ranks.items():
        v.status, v.signal, v.ended = "terminated", "SIGTERM", NOW + 0.01 * r
    found = {d.kind: d for d in _all(ranks, live=False)}
    assert set(found) == {"rank_died", "missing_rank"}, found
    whole = found["rank_died"]
    assert whole.severity == "info" and whole.evidence.whole
    assert whole.summary.startswith("The job was stopped as a whole: ranks 0-3 ended by SIGTERM")
    assert "first" not in whole.summary
    assert found["missing_rank"].rank == 1
    assert found["missing_rank"].location.endswith("train.py:22")  # type: ignore[union-attr]
    for v in ranks.values():
        v.status, v.signal, v.ended = "killed", None, None
    found = {d.kind: d for d in _all(ranks, live=False)}
    assert found["rank_died"].evidence.whole and found["missing_rank"].rank == 1


def test_the_directory_of_one_node_holds_no_cause() -> None:
    """Ranks 0, 1 of a 4-rank job (their node's own job directory) lost their peer: the rank
    that went first is among ranks 2, 3, which are not here."""
    ranks = {
        r: view(r, [*_history(r, 5), call(r, 5, 5, NOW - 3, state="failed")], 5,
                status="failed", ended=NOW - 2 + r, raised=raised(LOST, NOW - 2 + r))
        for r in (0, 1)
    }  # fmt: skip
    job = inputs(ranks, live=False)
    assert job.job is not None
    job.job.world_size = 4
    [d] = rank_died.diagnose(job)
    assert d.evidence.elsewhere and d.evidence.absent == "2,3"
    assert d.summary.startswith("No rank here failed on its own: ranks 0,1: lost a peer")
    assert "Ranks 2,3 of the 4 are not in this record" in d.summary


def test_a_rank_read_on_its_way_out_is_not_held_yet() -> None:
    # Read between its error and threading's shutdown (printing the traceback): not yet a rank
    # kept alive. Once the raise is rank_raised.SETTLE seconds old and the main thread is still
    # not seen waiting at exit (an exit handler that never returns), it is.
    printing = [frame("print_exception", 120, "/usr/lib/python3.11/traceback.py")]
    ranks = _stuck_job(printing)
    ranks[1].raised = raised("ValueError: corrupt record", NOW - 1, line=22)
    ranks[1].clock = NOW
    assert rank_raised.diagnose(inputs(ranks)) == []
    ranks[1].raised = raised("ValueError: corrupt record", NOW - rank_raised.SETTLE, line=22)
    [d] = rank_raised.diagnose(inputs(ranks))
    assert "something keeps it from exiting (a non-daemon thread, an exit handler)" in d.summary


def test_a_rank_that_raised_but_cannot_exit() -> None:
    uploader = ThreadStack(name="uploader", daemon=False, frames=[frame("upload_logs", 12)])
    at_exit = [frame("_shutdown", 1590, "/usr/lib/python3.11/threading.py")]
    ranks = _stuck_job(at_exit)
    ranks[1].raised = raised("ValueError: corrupt record", NOW - 20, line=22)
    ranks[1].threads = [uploader]
    job = inputs(ranks)
    [d] = rank_raised.diagnose(job)
    assert d.rank == 1 and d.location is not None and d.location.endswith("train.py:22")
    assert "Rank 1 raised ValueError: corrupt record at" in d.summary
    assert "its process is still alive: thread 'uploader' (" in d.summary
    assert "ranks 0,2,3: waiting in all_reduce #5" in d.summary
    assert any("daemon=True" in f for f in d.fix)
    # Not stuck, not a shorter loop, and not dead.
    assert missing_rank.diagnose(job) == uneven_batches.diagnose(job) == []
    assert rank_died.diagnose(job) == []
    # Afterwards: the others timed out, then the launcher stopped it.
    for r in (0, 2, 3):
        ranks[r].status, ranks[r].ended = "failed", NOW + r * 0.1
        ranks[r].raised = raised(TIMED_OUT, NOW + r * 0.1)
    ranks[1].status, ranks[1].signal, ranks[1].ended = "terminated", "SIGTERM", NOW + 1
    [d] = rank_died.diagnose(inputs(ranks, live=False))
    assert d.rank == 1 and d.summary.startswith("Rank 1 failed first: raised ValueError")
    assert "then stayed alive until terminated by SIGTERM, 20.0 s before" in d.summary
    assert "ranks 0,2,3: timed out waiting in all_reduce #5" in d.summary


def test_a_hang_at_exit_names_the_thread_that_holds_the_process() -> None:
    threads = [
        ThreadStack(name="MainThread", is_main=True, daemon=False,
                    frames=[frame("_shutdown", 1590, "/usr/lib/python3.11/threading.py")]),
        ThreadStack(name="uploader", daemon=False, frames=[frame("up", 12)]),
        ThreadStack(name="logger", daemon=True, frames=[frame("log", 80)]),
    ]  # fmt: skip
    capture = HangCapture(seconds=70, timeout=60, steps=5, threads=threads)
    [d] = hang.diagnose(Inputs(Block.empty(STEPS), Block.empty(STEPS), [], None, NOW, hang=capture))
    assert d.evidence.category == "exiting"
    assert "waits at exit for thread 'uploader' (" in d.summary and "logger" not in d.summary
    assert d.location is not None and d.location.endswith("train.py:12")


def test_the_job_timed_out_waiting_for_a_stuck_rank() -> None:
    """The process group's timeout came first: rank 0 timed out, then the launcher stopped
    rank 1, stuck in its read (its own hang caught its stack). Named from the journals; nobody
    'died first'."""
    ranks = _stuck_job(IN_LOAD_BATCH, waited=20.0)
    for r in (0, 2, 3):
        ranks[r].status, ranks[r].ended = "failed", NOW
        ranks[r].raised = raised(TIMED_OUT, NOW)
    ranks[1].status, ranks[1].signal, ranks[1].ended = "terminated", "SIGTERM", NOW + 0.5
    found = {d.kind: d for d in _all(ranks, live=False)}
    assert set(found) == {"missing_rank"}, found
    assert found["missing_rank"].rank == 1


# -- uneven data, whatever the last collective ------------------------------------------------
AFTER = f"{TRAIN}:58"  # after the training loop (30-50)


@pytest.mark.parametrize(
    ("op", "shapes"),
    [
        ("barrier", None),
        ("all_reduce", "[[3]]"),
        ("all_reduce", "[[8, 1]]"),
        ("broadcast", "[[1]]"),
    ],
)
def test_uneven_data_ending_in_any_collective(op: str, shapes: str | None) -> None:
    """Rank 1 ran out of batches and called `op` after its loop, where rank 0 issued the next
    step's gradient all-reduce: uneven batches, not a rank-0-only collective; a final
    all_reduce of the same shape as the gradients (paired without an error) too."""
    ranks = {r: view(r, _history(r, 5), 5) for r in (0, 1)}
    ranks[0] = view(0, [*_history(0, 5), call(0, 5, 5, NOW - 9, state="issued")], 5)
    last = call(1, 5, 5, NOW - 9, state="issued", op=op, shapes=shapes, site=AFTER)
    ranks[1] = view(1, [*_history(1, 5), last], 5)
    job = inputs(ranks)
    assert collective_mismatch.diagnose(job) == []
    [d] = uneven_batches.diagnose(job)
    assert d.rank == 1 and d.evidence.left["1"].call.op == op
    assert f"Rank 1 left its training loop after 5 steps and called {op} #5 at" in d.summary
    assert "while rank 0 calls all_reduce #5 of step 5" in d.summary
    # The same line on both ranks with other shapes stays a mismatch (a short last batch).
    ranks[1] = view(1, [*_history(1, 5), call(1, 5, 5, NOW - 9, shapes="[[3, 1]]")], 5)
    assert [d.kind for d in _all(ranks)] == ["collective_mismatch"]


# -- replicas that drift apart ----------------------------------------------------------------
def _checks(sums: dict[int, list[float]]) -> dict[int, dict[str, Any]]:
    names = ["0.weight", "0.bias", "2.weight"]
    return {s: {"model": {"names": names, "sums": v}} for s, v in sums.items()}


def test_replicated_parameters_that_drift_apart() -> None:
    same = {1: [1.0, 2.0, 3.0], 2: [1.1, 2.0, 3.0], 4: [1.2, 2.1, 3.0]}
    drifted = {**same, 4: [1.2, 2.1000001, 3.0]}
    ranks = {r: view(r, _history(r, 5), 5, checksums=_checks(same)) for r in (0, 1, 3)}
    ranks[2] = view(2, _history(2, 5), 5, checksums=_checks(drifted))
    [d] = replica_drift.diagnose(inputs(ranks))
    assert d.kind == "replica_drift" and d.rank == 2 and d.step == 4 and d.location == "0.bias"
    assert d.evidence.ranks == [2] and d.evidence.reference_ranks == [0, 1, 3]
    assert d.evidence.agreed_at == 2
    assert "after 4 steps rank 2 holds another copy than ranks 0,1,3" in d.summary
    assert ranks_text([2]) in d.fix[0]
    # Identical copies everywhere: nothing; the checks in events read back as they were sent.
    ranks[2] = view(2, _history(2, 5), 5, checksums=_checks(same))
    assert replica_drift.diagnose(inputs(ranks)) == []
    data = json.dumps({"step": 4, "model": "m", "names": ["w"], "sums": [0.5]})
    events = [{"kind": replica_drift.EVENT, "step": 5, "data": data}]
    assert replica_drift.checksums_of(events) == {4: {"m": {"names": ["w"], "sums": [0.5]}}}
    due = [s for s in range(1, 1001) if replica_drift.due(s)]
    assert due[:9] == [1, 2, 4, 8, 16, 32, 64, 100, 200]


def test_each_model_drifts_on_its_own_and_a_bypassed_wrapper_is_named() -> None:
    # Two replicated models: "a" apart after 2 steps on rank 1, "b" (trained through the module
    # DDP wraps) apart after 1: one finding each, the bypassed wrapper named as the cause.
    names = ["0.weight"]
    same = {1: {"a": {"names": names, "sums": [1.0]}, "b": {"names": names, "sums": [2.0]}}}
    same[2] = {"a": {"names": names, "sums": [1.5]}, "b": {"names": names, "sums": [2.5]}}
    odd = {1: {**same[1], "b": {"names": names, "sums": [2.1], "unwrapped": True}}}
    odd[2] = {"a": {"names": names, "sums": [1.6]}, "b": {"names": names, "sums": [2.6]}}
    ranks = {0: view(0, _history(0, 3), 3, checksums=same)}
    ranks[1] = view(1, _history(1, 3), 3, checksums=odd)
    b, a = replica_drift.diagnose(inputs(ranks))
    assert (b.evidence.model, b.step, b.evidence.agreed_at) == ("b", 1, None)
    assert (a.evidence.model, a.step, a.evidence.agreed_at) == ("a", 2, 1)
    assert b.evidence.unwrapped and not a.evidence.unwrapped
    assert "calls the module that DistributedDataParallel wraps (`b`)" in b.summary
    assert b.fix[0].startswith("call the DistributedDataParallel wrapper")
    assert a.fix[0].startswith("look for code that changes parameters on rank 1 only")
    assert a.key != b.key


# -- every rank given the same batches --------------------------------------------------------
LOADER = {"sampler": "SequentialSampler", "site": f"{TRAIN}:33", "num_workers": 0}


def _batched(rank: int, digests: dict[int, str], ddp: bool = True) -> RankView:
    checks = _checks({1: [1.0, 2.0, 3.0]}) if ddp else {}
    batches = RankBatches(digests, dict(LOADER))
    return view(rank, _history(rank, 4), 4, checksums=checks, batches=batches)


def test_ddp_ranks_given_the_same_batches_name_the_sampler() -> None:
    same = {1: "aa", 2: "bb", 3: "cc"}
    ranks = {r: _batched(r, same) for r in (0, 1)}
    [d] = same_batches.diagnose(inputs(ranks))
    assert (d.kind, d.severity, d.step, d.location) == ("same_batches", "warning", 3, TRAIN + ":33")
    assert d.evidence.ranks == [0, 1] and d.evidence.steps == [1, 2, 3]
    assert d.evidence.sampler == "SequentialSampler"
    assert "samples with SequentialSampler, not a DistributedSampler" in d.summary
    assert d.fix[0].startswith("give the DataLoader a DistributedSampler")
    # Ranks that differ on one common step, fewer than two common steps, or no DDP replicas
    # (a tensor-parallel group reads the same batch on purpose): nothing.
    ranks[1] = _batched(1, {**same, 3: "dd"})
    assert same_batches.diagnose(inputs(ranks)) == []
    ranks[1] = _batched(1, {3: "cc", 4: "ee"})
    assert same_batches.diagnose(inputs(ranks)) == []
    ranks = {r: _batched(r, same, ddp=False) for r in (0, 1)}
    assert same_batches.diagnose(inputs(ranks)) == []


def test_batch_digests_read_from_events_and_from_a_ranks_answers() -> None:
    window = {"steps": [1, 2, 3], "same": [], "digests": ["aa", "bb", "cc"], "model": "m"}
    events = [
        {"kind": same_batches.LOADER, "step": 0, "data": json.dumps(LOADER)},
        {"kind": same_batches.EVENT, "step": 3, "data": json.dumps(window)},
        {"kind": "silent.other", "step": 3, "data": "{}"},
    ]
    got = same_batches.batches_of(events)
    assert got.digests == {1: "aa", 2: "bb", 3: "cc"} and got.loader == LOADER
    record = RankRecord(0)
    columns = {"steps": list(STEPS.column_names), "collectives": list(COLLECTIVES.column_names)}
    answer = {"digests": {"1": "aa", "2": "bb"}, "loader": LOADER}
    record.update({"columns": columns, "steps_done": 2, "batches": answer})
    record.update({"columns": columns, "steps_done": 3, "batches": {"digests": {"3": "cc"}}})
    assert record.view().batches == RankBatches({1: "aa", 2: "bb", 3: "cc"}, LOADER)


# -- the answers, read the same at any number of ranks ----------------------------------------
def _all(ranks: dict[int, RankView], live: bool = True) -> list[Diagnosis]:
    job = inputs(ranks, live=live)
    return [d for m in job_modules() for d in m.diagnose(job)]


def _record(d: Diagnosis) -> Finding:
    return Finding.of(d)  # as its row reads back


def test_job_findings_once_and_own_findings_grouped() -> None:
    def straggler(step: int) -> Diagnosis:
        return Diagnosis("straggler", "warning", "Rank 1 is a straggler", step=step, rank=1,
                         job=True, key="straggler:1")  # fmt: skip

    def hang_of(rank: int, line: int, seconds: int) -> Finding:
        collective = decode("hang", {"category": "collective"})
        d = Diagnosis("hang", "error", f"No training step for {seconds} s", step=57, rank=rank,
                      location=f"train.py:{line}", evidence=collective)  # fmt: skip
        return _record(d)

    # Three reports of one straggler at other steps (two ranks, then the CLI's own): once.
    reported = [(0, _record(straggler(40))), (1, _record(straggler(45)))]
    reported += [(r, hang_of(r, 30 if r == 7 else 52, 60 + r)) for r in range(16)]
    records = merge_findings(reported, [_record(straggler(60))], job_kinds())
    assert [(r.kind, r.found_by) for r in records][:1] == [("straggler", [0, 1])]
    assert [r.kind for r in records].count("straggler") == 1
    groups = group_own([r for r in records if not r.job])
    assert [(rank_ranges(rs), r.location) for rs, r in groups] == [
        ("0-6,8-15", "train.py:52"),
        ("7", "train.py:30"),
    ]
    text = render_diagnoses(records, {20: "no answer", 21: "no answer"})
    heads = [b.splitlines()[0] for b in text.split("\n\n")]
    assert heads == [
        "job (found by ranks 0,1): [warning] straggler at step 60",
        "ranks 0-6,8-15: [error] hang at step 57 in train.py:52",
        "rank 7: [error] hang at step 57 in train.py:30",
        "ranks 20,21: unreachable: no answer",
    ]


def test_each_ranks_findings_are_told_in_the_storys_order() -> None:
    # pytorch/examples' DDP tutorial: each rank's doctor wrote zero_gradients (a MODULES entry
    # before loss_inputs) ahead of the loss_inputs it follows; the job's text told the
    # consequence first. It follows its cause, as on one rank.
    def of(rank: int) -> list[tuple[int, Finding]]:
        zero = Diagnosis("zero_gradients", "error", "zero", step=31, rank=rank,
                         follows="loss_inputs")  # fmt: skip
        cause = Diagnosis("loss_inputs", "error", "one class", step=1, rank=rank,
                          location="multigpu_torchrun.py:49")  # fmt: skip
        return [(rank, _record(zero)), (rank, _record(cause))]

    records = merge_findings(of(0) + of(1), [], job_kinds())
    heads = [b.splitlines()[0] for b in render_diagnoses(records, {}).split("\n\n")]
    assert heads == [
        "ranks 0,1: [error] loss_inputs at step 1 in multigpu_torchrun.py:49",
        "ranks 0,1: [error] zero_gradients at step 31",
    ]


def test_backtrace_folds_library_frames() -> None:
    torch_file = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"
    stack = [
        frame("_engine_run_backward", 979, torch_file),
        frame("backward", 395, "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py"),
        frame("backward", 623, "/venv/lib/python3.11/site-packages/torch/_tensor.py"),
        frame("main", 40),
        frame("<module>", 60),
    ]
    text = render_backtrace(group_stacks({r: stack for r in (0, 1, 2, 4)}), {})
    assert text.splitlines() == [
        "ranks 0-2,4: main thread",
        f"  _engine_run_backward ({torch_file}:979)",
        "  ... 2 frames of torch",
        f"  main ({TRAIN}:40)",
        f"  <module> ({TRAIN}:60)",
    ]
