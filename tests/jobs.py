"""Distributed jobs in tests: torchrun agents (one per "node") running a script under
TORCHDOCTOR=1, each node with its own socket directory, and the CLI pointed at one of them.

Every process of a job carries a marker in its environment; `stop()` ends the agents (SIGTERM,
which they pass on to their workers), kills whatever is left, and checks that no process with
the marker survives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from helpers import cli_in_process, free_port, wait_for

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MARK = "TORCHDOCTOR_TEST_JOB"


class Job:
    def __init__(
        self,
        root: Path,
        argv: list[str],
        nproc: int,
        nodes: int = 1,
        listen: tuple[bool, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """listen: per node, whether its ranks serve TCP (TORCHDOCTOR_LISTEN)."""
        self.root = root
        # Unix socket paths are limited to about 100 bytes: a short directory for them.
        self.sockets = Path(tempfile.mkdtemp(prefix="td-"))
        self.mark = uuid.uuid4().hex
        self.job_dir = root / "job"
        self.nodes = nodes
        self.agents: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
        base.update(
            {
                "TORCHDOCTOR": "1",
                "TORCHDOCTOR_RUN_DIR": str(self.job_dir),
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
                MARK: self.mark,
                **(env or {}),
            }
        )
        port = free_port()
        self.envs = []
        for node in range(nodes):
            node_env = dict(base, TORCHDOCTOR_SOCKET_DIR=str(self.socket_dir(node)))
            if node < len(listen) and listen[node]:
                node_env["TORCHDOCTOR_LISTEN"] = "127.0.0.1:0"
            self.envs.append(node_env)
            if nodes == 1:
                where = ["--standalone"]
            else:
                where = [
                    f"--nnodes={nodes}",
                    f"--node_rank={node}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-id={self.mark}",
                ]
            log = open(root / f"node{node}.log", "wb")  # noqa: SIM115 - closed in stop()
            self._logs.append(log)
            self.agents.append(
                subprocess.Popen(
                    [TORCHRUN, *where, f"--nproc_per_node={nproc}", *argv],
                    env=node_env,
                    cwd=root,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def socket_dir(self, node: int) -> Path:
        return self.sockets / f"s{node}"

    # -- the CLI --------------------------------------------------------------------------------
    def cli(
        self, *args: str, node: int = 0, timeout: float = 60, here: bool = False
    ) -> subprocess.CompletedProcess:
        """`torchdoctor ARGS` from `node`'s environment; here=True: through the CLI's main() in
        this process (for polls: see helpers.cli_in_process)."""
        if here:
            return cli_in_process(*args, env=self.envs[node], cwd=self.root)
        return subprocess.run(
            [sys.executable, "-m", "torchdoctor", *args],
            env=self.envs[node],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json(self, *args: str, node: int = 0, here: bool = False) -> Any:
        out = self.cli(*args, "--format", "json", node=node, here=here)
        assert out.returncode == 0, out.stderr + self.log()
        return json.loads(out.stdout)

    def entries(self, node: int = 0) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.socket_dir(node).glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def wait_ranks(self, ranks: int, timeout: float = 120) -> list[dict[str, Any]]:
        """Until every rank of the job answers `cluster list` (init_process_group done)."""

        def ready() -> Any:
            self.check_running()
            out = self.cli("cluster", "list", "--format", "json", here=True)
            if out.returncode != 0:
                return None
            listed = json.loads(out.stdout)["ranks"]
            return (
                listed
                if len(listed) == ranks and all(r["status"] == "ok" for r in listed)
                else None
            )

        return list(wait_for(ready, timeout, f"{ranks} ranks to answer", interval=0.1))

    def check_running(self) -> None:
        for agent in self.agents:
            if agent.poll() is not None:
                raise AssertionError(f"a torchrun agent exited early:\n{self.log()}")

    def log(self) -> str:
        for f in self._logs:
            f.flush()
        return "\n".join(
            f"--- node {n}\n" + (self.root / f"node{n}.log").read_text(errors="replace")[-6000:]
            for n in range(self.nodes)
        )

    def wait(self, timeout: float = 120) -> list[int]:
        """Until the agents exit on their own: their exit codes."""
        return [agent.wait(timeout) for agent in self.agents]

    # -- ending it -------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Every live process of this job (agents and workers), by the marker in its environment."""
        out = []
        needle = f"{MARK}={self.mark}".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if needle in (proc / "environ").read_bytes().split(b"\0"):
                    out.append(int(proc.name))
            except OSError:
                continue
        return out

    def stop(self) -> None:
        (self.root / "stop").touch()
        for agent in self.agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for agent in self.agents:
            try:
                agent.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for agent in self.agents:
            if agent.poll() is None:
                agent.wait(10)
        for f in self._logs:
            f.close()
        wait_for(lambda: not self.pids(), 10, "every process of the job to end")
        shutil.rmtree(self.sockets, ignore_errors=True)
