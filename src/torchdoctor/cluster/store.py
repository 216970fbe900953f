"""The job's own c10d store as the directory of its ranks' endpoints (DESIGN.md: no registry
service of our own). Under torchrun it is the agent's rendezvous store, which outlives any one
rank; with init_method env:// or tcp:// it is the TCPStore that rank 0 hosts.

torchdoctor talks to it over a connection of its own (`clone()`): the training's connection
is never shared with a probe thread. Keys live under `torchdoctor/endpoints/<attempt>/`, the
attempt being torchrun's restart count, so a restarted job never reads its last life's entries.
Runs in the rank only, where torch is imported.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from typing import Any

PREFIX = "torchdoctor/endpoints"
TIMEOUT = datetime.timedelta(seconds=5)


def key(rank: int) -> str:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{PREFIX}/{attempt}/rank{rank}"


class JobStore:
    def __init__(self, client: Any, address: str) -> None:
        self._client = client
        self.address = address
        self._lock = threading.Lock()  # one request at a time on our connection

    @classmethod
    def of_default_group(cls) -> JobStore | None:
        """Our own connection to the default process group's store (None before
        init_process_group, or for a store that cannot be shared)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        # torch keeps the default group's store in a private map; there is no public getter.
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        client = store.clone()  # type: ignore[attr-defined]  # missing from torch's stubs
        client.set_timeout(TIMEOUT)
        if isinstance(store, dist.TCPStore):
            address = f"{store.host}:{store.port}"
        else:
            address = str(getattr(store, "path", type(store).__name__))
        return cls(client, address)

    def publish(self, rank: int, entry: dict[str, Any]) -> None:
        with self._lock:
            self._client.set(key(rank), json.dumps(entry))

    def read(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """The entries of those of `ranks` that have published one."""
        out: dict[int, dict[str, Any]] = {}
        with self._lock:
            for rank in ranks:
                k = key(rank)
                if not self._client.check([k]):
                    continue
                try:
                    out[rank] = dict(json.loads(self._client.get(k)))
                except (ValueError, TypeError):
                    continue
        return out
