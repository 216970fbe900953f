"""Multi-rank jobs in tests: torchrun (`python -m torch.distributed.run`) or several processes.

torchrun starts each worker in a session of its own, so killing the agent's process group
does not reach them: `Job.end` finds every descendant first (/proc), then kills the process
group of each, so that no rank, agent or DataLoader worker outlives the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import free_port, wait_for


class Job:
    """Processes of one job (a torchrun agent and its ranks, or ranks started directly)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        n = len(self.procs)
        out = self.cwd / f"job{n}.out"
        self.logs.append(out)
        with open(out, "wb") as f:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=self.cwd,
                    env=dict(self.env, **(extra_env or {})),
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: ranks end with it
                )
            )

    def wait(self, timeout: float = 120) -> list[int]:
        return [p.wait(timeout) for p in self.procs]

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs)

    def end(self) -> None:
        """SIGKILL to every process of the job: agents, ranks and their children."""
        pids = [p.pid for p in self.procs if p.poll() is None]
        for pid in pids + [d for parent in pids for d in descendants(parent)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc), children before grandchildren."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(0), [])
        out += children
        todo += children
    return out


def torchrun_argv(nproc: int, script: str, *args: str, port: int | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={port or free_port()}",
        script,
        *args,
    ]


def rank_dirs(job_dir: Path, n: int, timeout: float = 60) -> list[Path]:
    """JOB_DIR/rank0 .. rank<n-1>, once each has its meta.json."""
    dirs = [job_dir / f"rank{r}" for r in range(n)]
    wait_for(lambda: all((d / "meta.json").exists() for d in dirs), timeout, "rank directories")
    return dirs
