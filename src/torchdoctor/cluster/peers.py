"""How to reach each rank of a job from here, or why it cannot be reached.

A rank's entry (what it published in the job's store) names its host, pid, Unix socket and,
when it listens, its TCP endpoint. A rank registered in this user's socket directory on this
host is asked over its Unix socket; any other one over TCP with its token; a rank that serves
no TCP on another node, or whose process has exited, is unreachable, with the reason.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

from torchdoctor import registry
from torchdoctor.cluster.transport import Target
from torchdoctor.store import rundir


@dataclasses.dataclass
class Peer:
    """One rank of the job: its published entry (None when it never published one) and how to
    reach it."""

    rank: int
    entry: dict[str, Any] | None
    target: Target | None = None
    reason: str | None = None  # why it cannot be reached
    gone: bool = False  # its process has exited (seen on this host)

    @property
    def reachable(self) -> bool:
        return self.target is not None

    def describe(self) -> dict[str, Any]:
        e = self.entry or {}
        return {
            "rank": self.rank,
            "local_rank": e.get("local_rank"),
            "node": e.get("node"),
            "host": e.get("host"),
            "pid": e.get("pid"),
            "endpoint": self.target.address if self.target else (e.get("tcp") or e.get("socket")),
            "via": self.target.via if self.target else None,
            "reachable": self.reachable,
            "reason": self.reason,
            "run_dir": e.get("run_dir"),
        }


def this_host() -> str:
    return socket.gethostname()


def route(rank: int, entry: dict[str, Any] | None, token: str | None = None) -> Peer:
    """The way to `rank` from this process. `token`: the one to use for TCP endpoints whose
    entry carries none (the user gave every rank the same --token)."""
    if entry is None:
        return Peer(
            rank,
            None,
            reason="not in the job's store: not started yet, still before init_process_group, "
            "or running without torchdoctor",
        )
    pid = int(entry.get("pid") or 0)
    same_host = entry.get("host") == this_host()
    local = _registered_here(pid, entry) if same_host else None
    if local is not None:
        return Peer(rank, entry, Target(f"rank {rank}", socket_path=local))
    if same_host and pid and not registry.alive(pid):
        return Peer(rank, entry, reason=f"process {pid} has exited{_ended(entry)}", gone=True)
    sock = entry.get("socket")
    if same_host and sock and not os.path.exists(sock):
        return Peer(rank, entry, reason=f"process {pid} is exiting: its endpoint is closed")
    tcp = entry.get("tcp")
    if tcp:
        host, _, port = str(tcp).rpartition(":")
        secret = entry.get("token") or token or os.environ.get("TORCHDOCTOR_TOKEN")
        return Peer(
            rank, entry, Target(f"rank {rank}", host=host.strip("[]"), port=int(port), token=secret)
        )
    where = f"node {entry.get('node')}" if entry.get("node") is not None else "another node"
    return Peer(
        rank,
        entry,
        reason=f"on {where} (host {entry.get('host')}) and serving no TCP endpoint: start the "
        "job with TORCHDOCTOR_LISTEN=0.0.0.0:0 (or --listen) to reach it from other nodes",
    )


def _registered_here(pid: int, entry: dict[str, Any]) -> str | None:
    """The Unix socket of `pid` when it is registered in this user's socket directory here."""
    try:
        mine = registry.find(pid)
    except registry.InsecureDirectory:
        return None
    if mine is None or mine.get("socket") != entry.get("socket"):
        return None
    return str(mine["socket"])


def _ended(entry: dict[str, Any]) -> str:
    """How a rank's process ended, from its meta.json when its run directory is readable."""
    run_dir = entry.get("run_dir")
    if not run_dir:
        return ""
    meta = rundir.read_meta(Path(run_dir))
    status = meta.get("status")
    return f" ({status})" if status and status != "running" else ""
