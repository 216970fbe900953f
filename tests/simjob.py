"""A job of many ranks without training them, for the scale test and benchmarks/cluster_scale.py.

`write_job` writes the rank directories a hung DDP job leaves, with torchdoctor's own writers
and findings made by its own diagnosis modules: every rank but one waits in all_reduce #57 at
train.py:52 (its own `hang` says so), the other is stuck in load_batch at train.py:30, and every
rank reported the `missing_rank` that names it. `serve` (run as `python simjob.py serve JOB_DIR
PORTS_FILE`) stands in for the ranks' endpoints: one token-protected TCP port per rank, all in
one process, answering the routes the `cluster` verbs use from those directories.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from torchdoctor.diagnose import hang, missing_rank
from torchdoctor.diagnose.inputs import HangCapture, Inputs, JobInputs, RankView
from torchdoctor.frames import StackFrame, ThreadStack
from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import SavedRun
from torchdoctor.store.schema import BY_NAME, COLLECTIVES, STEPS
from torchdoctor.store.tables import Spiller, Tables

STEPS_DONE = 57  # every rank finished steps 0..56; #57 is step 57's all-reduce
READ, REDUCE, LOOP = 30, 52, (44, 56)  # lines of train.py: the read, the all_reduce, the loop
SOURCE = (
    "\n".join(
        ["import torch.distributed as dist", *[""] * 28, "    return next(batches)  # load_batch"]
        + [""] * 13
        + ["for step in range(1000):"]  # line 44 .. 56: the training loop
        + ["    pass"] * 7
        + ["    dist.all_reduce(grads)"]  # line 52
        + ["    pass"] * 4
        + ["print('done')"]
    )
    + "\n"
)
TORCH = Path(sysconfig.get_paths()["purelib"]) / "torch" / "distributed"
T0 = 1_800_000_000.0
STEP_TIME = 0.1
NOW = T0 + STEPS_DONE * STEP_TIME + 0.05 + 12.0  # the ranks have waited 12 s
Call = COLLECTIVES.row_type()
Step = STEPS.row_type()


def frame(func: str, path: str | Path, line: int) -> StackFrame:
    return StackFrame(func=func, file=str(path), lineno=line)


def stack_of(train: Path, stuck: bool) -> list[StackFrame]:
    """The main thread's frames, innermost first."""
    if stuck:
        return [
            frame("load_batch", train, READ),
            frame("main", train, 48),
            frame("<module>", train, 58),
        ]
    return [
        frame("wait", TORCH / "distributed_c10d.py", 2981),
        frame("all_reduce", TORCH / "distributed_c10d.py", 2950),
        frame("wrapper", TORCH / "c10d_logger.py", 83),
        frame("main", train, REDUCE),
        frame("<module>", train, 58),
    ]


def _call(rank: int, seq: int, site: str, state: str) -> tuple[Any, ...]:
    return tuple(
        Call(
            step=seq, group="default", seq=seq, op="all_reduce", shapes="[[1024]]",
            dtype="float32", bytes=4096, peer=None, time=T0 + seq * STEP_TIME + 0.05,
            duration=None if state == "issued" else 0.001, state=state, site=site, rank=rank,
        )
    )  # fmt: skip


def _step(rank: int, step: int) -> tuple[Any, ...]:
    return tuple(
        Step(
            step=step, time=T0 + (step + 1) * STEP_TIME, duration=STEP_TIME, data_wait=0.01,
            forward=0.03, backward=0.04, optimizer=0.01, other=0.01, loss=1.0, grad_norm=1.0,
            lr=0.1, allocated=1, max_allocated=1, reserved=1, rss=1, rank=rank,
            micro_batches=1, skipped=False, traced=False,
        )
    )  # fmt: skip


def write_job(root: Path, world: int, stuck: int | None = None, stopped: bool = False) -> Path:
    """root/train.py and root/job/rank<N> for N < world, rank `stuck` (default 7, or the last)
    stuck in its read; `stopped`: the user stopped the hung job afterwards (every rank
    terminated by SIGTERM at once), else the ranks still run."""
    stuck = min(7, world - 1) if stuck is None else stuck
    root.mkdir(parents=True, exist_ok=True)
    train = root / "train.py"
    train.write_text(SOURCE)
    job_dir = root / "job"
    site = f"{train}:{REDUCE}"
    now = NOW
    views, calls = {}, {}
    for rank in range(world):
        rows = [_call(rank, s, site, "completed") for s in range(STEPS_DONE)]
        if rank != stuck:
            rows.append(_call(rank, STEPS_DONE, site, "issued"))
        calls[rank] = rows
        views[rank] = RankView(
            rank=rank,
            steps=Block.from_rows(STEPS, [_step(rank, s) for s in range(STEPS_DONE)]),
            collectives=Block.from_rows(COLLECTIVES, rows),
            stack=stack_of(train, rank == stuck),
            clock=now,
        )
    job = JobInputs(views, world, now, hang_timeout=5.0, loops={str(train): [LOOP]})
    held = missing_rank.diagnose(_inputs(job, now))
    pid = os.getpid()
    for rank in range(world):
        run = rundir.create(job_dir / f"rank{rank}")
        tables = Tables()
        for s in range(STEPS_DONE):
            tables["steps"].append(_step(rank, s))
        journal = tables["collectives"]
        journal.attach(lambda run=run: run)
        for row in calls[rank]:
            rid = journal.issue(row)
            if row[COLLECTIVES.index("state")] != "issued":
                journal.end(rid, 0.001, "completed")
        journal.close()
        for d in [*_own_hang(views[rank], calls[rank], now), *held]:
            if not d.job:
                d.rank = rank
            d.time = now
            tables["diagnoses"].append(d.row())
        Spiller(tables, run).stop()
        meta: dict[str, Any] = {
            "pid": pid,
            "host": f"sim-node-{rank // 8}",  # not this host: no process of it is looked for
            "rank": rank,
            "local_rank": rank % 8,
            "world_size": world,
            "node": str(rank // 8),
            "job": "simulated",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(T0 - 30)),
            "status": "running",
            "command": f"python {train}",
        }
        if stopped:
            ended = time.localtime(now + 1 + rank * 1e-4)
            meta.update(status="terminated", signal="SIGTERM", exit_code=None, steps=STEPS_DONE)
            meta["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S", ended) + f".{rank:04d}"
        rundir.write_meta(run, meta)
    return job_dir


def _inputs(job: JobInputs, now: float, capture: HangCapture | None = None) -> Inputs:
    return Inputs(
        steps=Block.empty(STEPS),
        module_grads=Block.empty(BY_NAME["module_grads"]),
        events=[],
        config=None,
        now=now,
        hang=capture,
        job=job,
    )


def _own_hang(view: RankView, rows: list[tuple[Any, ...]], now: float) -> list[Any]:
    """The rank's own `hang`, as its doctor would have found it."""
    names = COLLECTIVES.column_names
    pending = [
        dict(zip(names, r, strict=True)) for r in rows if r[names.index("state")] == "issued"
    ]
    threads = [ThreadStack(thread_id=1, name="MainThread", is_main=True, daemon=False,
                           frames=view.stack or [])]  # fmt: skip
    capture = HangCapture(12.0, 5.0, STEPS_DONE, threads, pending)
    steps = Block.from_rows(STEPS, [])
    return hang.diagnose(Inputs(steps, steps, [], None, now, hang=capture))


# -- the stand-in endpoints ----------------------------------------------------------------------
def serve(job_dir: Path, ports_file: Path) -> None:
    """One TCP endpoint per rank directory, until killed; `ports_file` gets
    {"ports": [...], "tokens": [...]} once every one listens."""
    from torchdoctor.probe.server import Routes, TcpServer, serve_in_background

    ranks = sorted(int(p.name[4:]) for p in job_dir.glob("rank*"))
    runs = {r: SavedRun(job_dir / f"rank{r}") for r in ranks}
    servers, tokens = [], []
    for rank in ranks:
        token = f"token-{rank}"
        server = TcpServer("127.0.0.1", 0, token, Routes())
        servers.append(server)
        tokens.append(token)
    ports = [s.server_address[1] for s in servers]
    entries = {
        str(r): {
            "rank": r,
            "local_rank": r % 8,
            "world_size": len(ranks),
            "node": str(r // 8),
            "job": "simulated",
            "host": f"sim-node-{r // 8}",  # another host: reached over TCP with its token
            "pid": 0,
            "socket": None,
            "tcp": f"127.0.0.1:{ports[i]}",
            "token": tokens[i],
            "run_dir": str(job_dir / f"rank{r}"),
        }
        for i, r in enumerate(ranks)
    }
    for i, rank in enumerate(ranks):
        _routes(servers[i].routes, rank, runs[rank], entries)
        serve_in_background(servers[i], f"sim-rank-{rank}")
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ports": ports, "tokens": tokens}))
    tmp.rename(ports_file)
    while True:
        time.sleep(3600)


def _routes(routes: Any, rank: int, run: SavedRun, entries: dict[str, Any]) -> None:
    from torchdoctor.cluster.saved import rank_view
    from torchdoctor.cluster.state import current_calls
    from torchdoctor.store.table import RingTable

    view = rank_view(rank, run)
    stack = view.stack or []
    world = len(entries)
    tables = {name: RingTable(BY_NAME[name]) for name in ("steps", "collectives")}
    for name, table in tables.items():
        block = run.block(name)
        for record in block.to_records():
            table.append(tuple(record[c] for c in BY_NAME[name].column_names))
    diagnoses = run.block("diagnoses")
    columns = list(BY_NAME["diagnoses"].column_names)
    found = {"columns": columns, "rows": [list(r.values()) for r in diagnoses.to_records()]}
    trace = BY_NAME["backtrace"].column_names
    backtrace = {
        "columns": list(trace),
        "rows": [
            [1, "MainThread", depth, f.func, f.file, f.lineno, f.code, True]
            for depth, f in enumerate(stack)
        ],
    }

    def peers(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {
            "rank": rank,
            "world_size": world,
            "node": str(rank // 8),
            "job": "simulated",
            "store": "sim-store:29500",
            "store_error": None,
            "entries": entries,
        }

    def state(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from torchdoctor.cluster.state import table_tail

        limit = min(int(req.get("rows", 0)), 512)
        since = req.get("since") or {}
        out: dict[str, Any] = {
            "rank": rank,
            "local_rank": rank % 8,
            "world_size": world,
            "node": str(rank // 8),
            "time": NOW,
            "status": "running",
            "steps_done": view.steps_done,
            "phase": "data" if not any("c10d" in f.file for f in stack) else "backward",
            "stack": stack,
            "hang_timeout": 5.0,
            "columns": {n: list(BY_NAME[n].column_names) for n in tables},
            "kinds": ["hang"],
            "checksums": [],
            "current": current_calls(tables["collectives"]),
        }
        if req.get("findings"):
            out["diagnoses"] = found
        if limit > 0:
            for name, table in tables.items():
                got, cursor = table_tail(table, since.get(name), limit)
                out[name] = {"rows": got, "cursor": cursor}
        return 200, out

    routes.add("GET", "/v1/cluster/peers", peers)
    routes.add("POST", "/v1/cluster/state", state)
    routes.add("GET", "/v1/backtrace", lambda _req: (200, backtrace))
    routes.add("GET", "/v1/diagnoses", lambda _req: (200, found))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "write":
        print(write_job(Path(sys.argv[2]), int(sys.argv[3]), stopped="--stopped" in sys.argv))
