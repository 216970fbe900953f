"""The same request to every rank of a job at once; a rank that cannot be asked answers with
the reason. Light: the CLI's `cluster list` imports nothing heavier."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable
from typing import Any

from torchdoctor.cluster.peers import Peer
from torchdoctor.cluster.transport import Unreachable, request

MAX_WORKERS = 32


class Answer:
    """One rank's answer to one request: payload, or the reason it could not be asked."""

    def __init__(
        self, peer: Peer, status: int = 0, payload: Any = None, reason: str | None = None
    ) -> None:
        self.peer = peer
        self.status = status
        self.payload = payload
        self.reason = reason
        self.gone = peer.gone

    @property
    def ok(self) -> bool:
        return self.reason is None and self.status == 200


def fan_out(
    peers: Iterable[Peer],
    method: str,
    path: str,
    body: Callable[[Peer], dict[str, Any] | None] | dict[str, Any] | None = None,
    timeout: float = 5.0,
) -> dict[int, Answer]:
    """The same request to every peer in parallel; unreachable ones answered with the reason."""
    peers = list(peers)
    out: dict[int, Answer] = {}

    def ask(peer: Peer) -> Answer:
        if peer.target is None:
            return Answer(peer, reason=peer.reason)
        data = body(peer) if callable(body) else body
        try:
            status, payload = request(peer.target, method, path, data, timeout)
        except Unreachable as exc:
            return Answer(peer, reason=str(exc))
        return Answer(peer, status, payload)

    reachable = [p for p in peers if p.target is not None]
    for peer in peers:
        if peer.target is None:
            out[peer.rank] = ask(peer)
    if reachable:
        workers = min(MAX_WORKERS, len(reachable))
        with concurrent.futures.ThreadPoolExecutor(workers, "torchdoctor-fanout") as pool:
            for answer in pool.map(ask, reachable):
                out[answer.peer.rank] = answer
    return dict(sorted(out.items()))
