"""Who this process is in a distributed job: global rank, local rank, world size, node, job.

Read from the launcher's environment when the probe starts (torchrun sets RANK, LOCAL_RANK,
WORLD_SIZE, TORCHELASTIC_RUN_ID, MASTER_ADDR/PORT), and again from torch.distributed when
`init_process_group` returns (scripts that pass rank and world_size themselves, and
torch.multiprocessing.spawn ranks). `job` names the job the same way on every rank: torchrun's
run id, else the rendezvous address (init_method, or MASTER_ADDR:MASTER_PORT).

The job directory is where every rank of one job writes, rank N to `JOB_DIR/rank<N>/`:
  --run-dir / TORCHDOCTOR_RUN_DIR      that directory
  the launcher is probed (mp.spawn)    the launcher's run directory
  otherwise                            ./torchdoctor-runs/<launcher start>-<host>-<launcher pid>
The launcher is the parent process (torchrun's agent, the mp.spawn script, the shell that
started the ranks), so every rank it started names the same directory without talking.

No torch here: the start-up hook and the CLI read identities too.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RANK_DIR_PREFIX = "rank"
FIELDS = ("rank", "local_rank", "world_size", "node", "job")


@dataclasses.dataclass(frozen=True)
class RankIdentity:
    rank: int  # global rank
    local_rank: int  # rank on this node (LOCAL_RANK when the launcher sets it)
    world_size: int
    node: str  # host name
    job: str | None  # the same on every rank of the job; None when nothing names it

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def dir_name(self) -> str:
        return f"{RANK_DIR_PREFIX}{self.rank}"


def _int(value: Any) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def node_name() -> str:
    return socket.gethostname() or "localhost"


def job_from_env(env: Mapping[str, str], init_method: str | None = None) -> str | None:
    """torchrun's run id; else the rendezvous address the ranks met at."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return run_id
    if init_method and init_method != "env://":
        return init_method
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if addr and port:
        return f"{addr}:{port}"
    return None


def rank_from_env(env: Mapping[str, str] | None = None) -> int:
    """The rank a launcher gave this process (RANK, else LOCAL_RANK), 0 when none did: the
    rank rows carry before torch.distributed says (from_env needs the world size too)."""
    env = os.environ if env is None else env
    for var in ("RANK", "LOCAL_RANK"):
        value = _int(env.get(var))
        if value is not None and value >= 0:
            return value
    return 0


def from_env(env: Mapping[str, str] | None = None) -> RankIdentity | None:
    """The identity a launcher gave this process in its environment, or None (not a rank)."""
    env = os.environ if env is None else env
    rank, world = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
    if rank is None or world is None or world < 1 or rank >= world:
        return None
    local = _int(env.get("LOCAL_RANK"))
    return RankIdentity(
        rank=rank,
        local_rank=local if local is not None else rank,
        world_size=world,
        node=node_name(),
        job=job_from_env(env),
    )


def from_process_group(
    rank: int, world_size: int, init_method: str | None = None, env: Mapping[str, str] | None = None
) -> RankIdentity:
    """The identity once torch.distributed knows it (rank and size of the default group)."""
    env = os.environ if env is None else env
    local = _int(env.get("LOCAL_RANK"))
    if _int(env.get("RANK")) != rank:
        local = None  # LOCAL_RANK belongs to another numbering (a launcher's, not this job's)
    return RankIdentity(
        rank=rank,
        local_rank=local if local is not None else rank,
        world_size=world_size,
        node=node_name(),
        job=job_from_env(env, init_method),
    )


def rank_dir(job_dir: Path, identity: RankIdentity) -> Path:
    return job_dir / identity.dir_name


def launcher_started(pid: int) -> float | None:
    """When process `pid` started (Unix seconds), from /proc; None where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = int(fields[19])  # field 22 of stat: start time, in clock ticks after boot
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def default_job_dir(parent: Path, launcher_pid: int, identity: RankIdentity) -> Path:
    """The job directory every rank started by one launcher agrees on, without talking."""
    started = launcher_started(launcher_pid)
    host = node_name().split(".")[0] or "host"
    if started is None:  # no /proc: the job's own name, the same on every rank
        slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in identity.job or "job")
        return parent / f"job-{slug}"
    stamp = _dt.datetime.fromtimestamp(int(started)).strftime("%Y%m%d-%H%M%S")
    return parent / f"{stamp}-{host}-{launcher_pid}"
