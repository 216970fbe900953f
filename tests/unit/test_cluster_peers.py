"""How each rank of a job is reached from here, or why not: real registry directories and real
processes (this one, and one that has exited)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor import registry
from torchdoctor.cluster.peers import route, this_host


@pytest.fixture
def socket_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "s"
    monkeypatch.setenv(registry.ENV_DIR, str(path))
    registry.ensure_dir()
    return path


def _entry(pid: int, **kw: object) -> dict:
    return {"rank": 1, "pid": pid, "host": this_host(), "node": "n0", "socket": "/x.sock", **kw}


def test_a_rank_registered_here_is_asked_over_its_unix_socket(socket_dir: Path) -> None:
    me = registry.socket_path(1)
    registry.register(1, {"pid": 1, "socket": str(me)})  # pid 1 is alive on every Linux
    peer = route(1, _entry(1, socket=str(me)))
    assert peer.target is not None and peer.target.via == "unix"
    assert peer.target.socket_path == str(me)


def test_a_rank_elsewhere_is_asked_over_tcp_with_its_token(socket_dir: Path) -> None:
    peer = route(2, _entry(1, host="other-node", tcp="10.0.0.2:4567", token="t0k"))
    assert peer.target is not None and peer.target.via == "tcp"
    assert (peer.target.host, peer.target.port, peer.target.token) == ("10.0.0.2", 4567, "t0k")
    # No token in the store (the user gave every rank --token): the one given here is used.
    peer = route(2, _entry(1, host="other-node", tcp="10.0.0.2:4567"), token="mine")
    assert peer.target is not None and peer.target.token == "mine"


def test_unreachable_ranks_say_why(socket_dir: Path) -> None:
    peer = route(3, _entry(1, host="other-node", node="n1"))
    assert peer.target is None
    assert peer.reason is not None and "on node n1 (host other-node)" in peer.reason
    assert "serving no TCP endpoint" in peer.reason and "TORCHDOCTOR_LISTEN" in peer.reason

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    peer = route(1, _entry(child.pid))
    assert peer.target is None and peer.gone
    assert peer.reason == f"process {child.pid} has exited"

    # Alive, on this host, its socket gone: it is shutting down.
    peer = route(1, _entry(1, socket=str(socket_dir / "gone.sock")))
    assert peer.target is None and peer.reason == "process 1 is exiting: its endpoint is closed"

    peer = route(4, None)
    assert peer.target is None and peer.reason is not None
    assert "not in the job's store" in peer.reason
