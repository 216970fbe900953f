"""The rank's own view of its job, kept by a background thread.

Once init_process_group has run, the thread publishes this rank's endpoint in the job's store,
reads the other ranks' entries, and asks them for their state: a light question every couple
of seconds (where are you, which collectives are pending) and their recent rows now and then.
It asks at once when a collective here has waited for the hang timeout. The doctor reads
`job_inputs()` on each pass, so the job-level diagnoses (missing_rank, uneven_batches, ...)
appear in every rank's own `diagnoses`.

Jobs of more than MAX_PERIODIC ranks only ask when a collective here waits too long, so a big
job's ranks do not question each other all the time.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torchdoctor._failsafe import warn_once
from torchdoctor._version import __version__
from torchdoctor.cluster.fanout import fan_out
from torchdoctor.cluster.member import node_rank, this_member
from torchdoctor.cluster.peers import Peer, route, this_host
from torchdoctor.cluster.store import JobStore
from torchdoctor.identity import RankIdentity
from torchdoctor.store.schema import COLLECTIVES
from torchdoctor.store.tables import Tables
from torchdoctor.views import TrainingView

# cluster.gather and cluster.state (and the diagnoses they read) are imported by the methods
# that run once this process is a rank of a job: a process that is none never loads them.
if TYPE_CHECKING:
    from torchdoctor.cluster import gather
    from torchdoctor.diagnose.inputs import JobInputs
    from torchdoctor.telemetry.replicas import ReplicaChecks

TICK = 1.0
PULSE = 2.0  # light questions to every rank
FULL = 15.0  # recent rows from every rank (straggler, mismatch)
URGENT_FULL = 5.0  # recent rows while a collective waits too long
MAX_PERIODIC = 32
REQUEST_TIMEOUT = 3.0


class WatchHost(Protocol):
    tables: Tables
    pid: int
    started: float
    run_dir: Path
    token: str | None
    tcp_address: tuple[str, int] | None
    identity: RankIdentity | None  # who this process is in its job, as far as known

    @property
    def telemetry(self) -> TrainingView | None: ...


class ClusterWatch:
    def __init__(
        self,
        host: WatchHost,
        socket_path: Path | None,
        hang_timeout: Callable[[], float],
        token_given: bool,
    ) -> None:
        self.host = host
        self.socket_path = socket_path
        self.hang_timeout = hang_timeout
        self.token_given = token_given  # the user's --token: never put in the store
        self.member: RankIdentity | None = None
        self.store: Any = None
        self.store_error: str | None = None
        self.published = False
        self._run_dir = ""  # as published
        self.entries: dict[int, dict[str, Any]] = {}
        self.records: dict[int, gather.RankRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_light = 0.0
        self._last_full = 0.0
        self._gathered = 0  # gathers done
        self._served = 0  # the gather the doctor last got a view of
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-cluster", daemon=True)
        self.replicas: ReplicaChecks | None = None  # once this rank is in a job

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.replicas is not None:
            self.replicas.detach()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            try:
                self.tick()
            except Exception as exc:  # never into the training; say it once
                warn_once("cluster", f"the job view failed: {type(exc).__name__}: {exc}")

    # -- one tick --------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        member = self.member or this_member(self.host.identity)
        if member is None or member.world_size < 2:
            return
        self.member = member
        if self.replicas is None and self.host.telemetry is not None:
            # Checksums of the replicated parameters, compared across the ranks' views (loaded
            # only now: it needs torch, which a process that never imports it must not pay).
            from torchdoctor.telemetry import replicas

            self.replicas = replicas.attach(self.host.telemetry)
        if not self.published or self._moved():
            self._publish(member)
            if not self.published:
                return
        now = time.time() if now is None else now
        timeout = self.hang_timeout()
        urgent = self._waiting_for(now) >= timeout
        periodic = member.world_size <= MAX_PERIODIC
        if not (urgent or periodic) or now - self._last_light < PULSE:
            return
        full = now - self._last_full >= (URGENT_FULL if urgent else FULL)
        self.gather(full)
        self._last_light = now
        if full:
            self._last_full = now

    def _waiting_for(self, now: float) -> float:
        """How long the oldest pending collective here, or at any rank heard from, has waited."""
        from torchdoctor.cluster.state import current_calls

        state, when = COLLECTIVES.index("state"), COLLECTIVES.index("time")
        training = self.host.telemetry
        if training is not None:
            training.settle_collectives()
        calls = current_calls(self.host.tables["collectives"])
        times = [float(r[when]) for r in calls if r[state] != "completed"]
        with self._lock:
            times += [t for rec in self.records.values() if (t := rec.pending_since()) is not None]
        return now - min(times) if times else 0.0

    def _publish(self, member: RankIdentity) -> None:
        try:
            if self.store is None:
                self.store = JobStore.of_default_group()
                if self.store is None:
                    return
            entry = self.entry(member)
            self.store.publish(member.rank, entry)
            self.published = True
            self._run_dir = entry["run_dir"]
            self.store_error = None
        except Exception as exc:
            self.store_error = f"{type(exc).__name__}: {exc}"
            warn_once("cluster-store", f"cannot publish this rank's endpoint: {self.store_error}")

    def _moved(self) -> bool:
        """The record moved into the job directory after this rank published its entry."""
        return str(self.host.run_dir) != self._run_dir

    def entry(self, member: RankIdentity) -> dict[str, Any]:
        """What this rank publishes: enough for any rank or CLI to reach it."""
        out: dict[str, Any] = {
            "rank": member.rank,
            "local_rank": member.local_rank,
            "world_size": member.world_size,
            "node": node_rank() or member.node,
            "job": member.job,
            "host": this_host(),
            "pid": self.host.pid,
            "socket": str(self.socket_path) if self.socket_path else None,
            "run_dir": str(self.host.run_dir),
            "started": self.host.started,
            "version": __version__,
        }
        if self.host.tcp_address is not None:
            host, port = self.host.tcp_address
            out["tcp"] = f"{_reachable(host, self.store)}:{port}"
            if not self.token_given:
                out["token"] = self.host.token  # generated: the store is the job's trust domain
        return out

    # -- the other ranks ---------------------------------------------------------------------
    def peers(self) -> list[Peer]:
        """Every rank of the job and how to reach it from this process."""
        member = self.member
        if member is None:
            return []
        missing = [r for r in range(member.world_size) if r not in self.entries]
        if missing and self.store is not None:
            try:
                self.entries.update(self.store.read(missing))
                self.store_error = None
            except Exception as exc:  # the store's host is gone: keep the entries read so far
                self.store_error = f"{type(exc).__name__}: {exc}"
        token = self.host.token if self.token_given else None
        return [route(r, self.entries.get(r), token) for r in range(member.world_size)]

    def gather(self, full: bool) -> None:
        member = self.member
        if member is None:
            return
        from torchdoctor.cluster import gather

        peers = [p for p in self.peers() if p.rank != member.rank]
        with self._lock:
            cursors = {r: dict(rec.cursors) for r, rec in self.records.items()}

        def body(peer: Peer) -> dict[str, Any]:
            return {"rows": gather_rows(full), "since": cursors.get(peer.rank, {})}

        answers = fan_out(peers, "POST", "/v1/cluster/state", body, REQUEST_TIMEOUT)
        own = self.own_state(rows=gather_rows(full), since=cursors.get(member.rank))
        with self._lock:
            for rank, answer in answers.items():
                record = self.records.setdefault(rank, gather.RankRecord(rank))
                record.entry = answer.peer.entry
                if answer.ok:
                    record.update(answer.payload)
                else:
                    record.lost(answer.reason or f"HTTP {answer.status}", answer.gone)
            record = self.records.setdefault(member.rank, gather.RankRecord(member.rank))
            record.entry = self.entry(member)
            record.update(own)
            self._gathered += 1

    def own_state(
        self, rows: int, since: dict[str, int] | None = None, findings: bool = False
    ) -> dict[str, Any]:
        member = self.member or this_member(self.host.identity)
        if member is None:
            raise LookupError("this process is not part of a distributed job (yet)")
        from torchdoctor.cluster.state import rank_state

        return rank_state(self.host, member, self.hang_timeout(), since, rows, findings)

    def job_inputs(self) -> JobInputs | None:
        """The job as last gathered, with this rank's own state fresh: once after each
        gather, and on every call while a collective waits for half the hang timeout or more.
        None otherwise, and outside a job: nothing new to compare."""
        member = self.member
        if member is None or len(self.records) < 2:
            return None
        from torchdoctor.cluster import gather

        timeout = self.hang_timeout()
        urgent = self._waiting_for(time.time()) >= timeout / 2
        if self._served == self._gathered and not urgent:
            return None
        own = self.own_state(rows=0)
        with self._lock:
            self._served = self._gathered
            self.records[member.rank].update(own)
            return gather.job_inputs(dict(self.records), member.world_size, timeout)

    def peers_payload(self) -> dict[str, Any]:
        member = self.member or this_member(self.host.identity)
        if member is None:
            raise LookupError(
                "this process is not part of a distributed job: torch.distributed is not "
                "initialised here"
            )
        self.member = member
        if not self.published:
            self._publish(member)
        return {
            "rank": member.rank,
            "world_size": member.world_size,
            "node": member.node,
            "job": member.job,
            "store": getattr(self.store, "address", None),
            "store_error": self.store_error,
            "entries": {str(r): e for r, e in self._entries_now(member).items()},
        }

    def _entries_now(self, member: RankIdentity) -> dict[int, dict[str, Any]]:
        self.peers()  # reads the entries still missing
        out = dict(self.entries)
        out[member.rank] = self.entry(member)
        return out


def gather_rows(full: bool) -> int:
    return 512 if full else 0


def _reachable(host: str, store: Any) -> str:
    """An address other nodes can use for a server bound to `host` (0.0.0.0 is no address):
    the local address of the route towards the store's host."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    target = str(getattr(store, "address", "")).rpartition(":")[0] or "8.8.8.8"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # UDP: nothing is sent, the kernel only picks the route
            return str(s.getsockname()[0])
    except OSError:
        return os.uname().nodename
