"""The signal watcher's wakeup fd, in this process: the script's own fd gets every byte and sees
only its own fds; a forked child gives the fd back (its signals are not the parent's)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import pytest

from torchdoctor.telemetry.signal_watch import SignalWatch


@pytest.fixture
def watch() -> Iterator[SignalWatch]:
    before = signal.signal(signal.SIGUSR1, lambda *_: None)  # a Python handler: bytes written
    seen: list[int] = []
    w = SignalWatch(lambda signum: False, seen.append)
    assert w.start()
    try:
        yield w
    finally:
        w.stop()
        signal.signal(signal.SIGUSR1, before)
    assert seen == []  # nothing here is a signal the watcher acts on
    assert signal.set_wakeup_fd(-1) == -1  # given back


def test_the_scripts_fd_gets_every_byte_and_sees_its_own(watch: SignalWatch) -> None:
    theirs, reader = socket.socketpair()
    theirs.setblocking(False)
    try:
        assert signal.set_wakeup_fd(theirs.fileno()) == -1  # as if no one had set one
        os.kill(os.getpid(), signal.SIGUSR1)
        reader.settimeout(30)
        assert reader.recv(1) == bytes([signal.SIGUSR1])  # forwarded by the watcher's thread
        assert signal.set_wakeup_fd(-1) == theirs.fileno()
        assert signal.set_wakeup_fd(-1) == -1
        blocking, other = os.pipe()
        with pytest.raises(ValueError, match="non-blocking"):  # fails as it fails without us
            signal.set_wakeup_fd(blocking)
        assert signal.set_wakeup_fd(-1) == -1
        os.close(blocking)
        os.close(other)
    finally:
        theirs.close()
        reader.close()


def test_a_forked_child_gives_the_fd_back(watch: SignalWatch) -> None:
    ours = signal.set_wakeup_fd(-1)  # the real fd behind the script's view: the watcher's
    signal.set_wakeup_fd(ours)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what is the real wakeup fd now?
        real = signal.set_wakeup_fd(-1)
        os.write(write, str(real).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        assert f.read() == "-1"
    assert os.waitpid(pid, 0)[1] == 0
