"""The same request to every rank of a job at once; a rank that cannot be asked answers with
the reason. Light: the CLI's `cluster list` imports nothing heavier.

The requests go out from daemon threads of our own, not a concurrent.futures pool: a rank whose
main code has ended (an exception, while a non-daemon thread keeps the process alive) is in the
interpreter's shutdown, where such pools refuse new work, and it must still see the others."""

from __future__ import annotations

import queue
import threading
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
        except Exception as exc:  # a bug here must not lose the other ranks' answers
            return Answer(peer, reason=f"{type(exc).__name__}: {exc}")
        return Answer(peer, status, payload)

    todo: queue.SimpleQueue[Peer] = queue.SimpleQueue()
    for peer in peers:
        if peer.target is None:
            out[peer.rank] = ask(peer)
        else:
            todo.put(peer)

    def work() -> None:
        while True:
            try:
                peer = todo.get_nowait()
            except queue.Empty:
                return
            out[peer.rank] = ask(peer)  # one key per rank: dict assignment is atomic

    workers = [
        threading.Thread(target=work, name="torchdoctor-fanout", daemon=True)
        for _ in range(min(MAX_WORKERS, todo.qsize()))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return dict(sorted(out.items()))
