"""A signal our handler must act on, seen from a thread of ours when the main thread cannot run
Python.

A Python signal handler runs on the main thread, between two bytecodes. While the main thread
waits in C (a collective whose peer is stuck, a CUDA synchronize, a long C call), or when the
kernel delivered the signal to another thread while the main thread sleeps, the handler waits
with it. Without torchdoctor a SIGTERM would have ended the process at once (its default
disposition needs no Python): torchrun stopping a job, a scheduler cancelling one. So:

- Python's C-level handler writes the signal's number to the wakeup fd from whichever thread
  the signal interrupted. Ours is one end of a socket pair; the watcher thread reads the other.
- For a signal whose Python handler is ours and whose disposition behind it is the default
  (`wanted`), the watcher gives the main thread GRACE seconds to start the handler. If it has
  not (`claim` decides who goes: exactly one of them), the watcher runs it here (`act`): the
  tables and the ending are saved, then the default disposition ends the process, with the
  same status. Should our handler itself take longer than DEADLINE, the signal ends the
  process all the same.
- The script keeps its own wakeup fd (asyncio's self-pipe): `signal.set_wakeup_fd` is wrapped,
  the script's fd gets every byte, forwarded, and the script sees only its own fds.
- A forked child (a DataLoader worker) puts the wakeup fd back: its signals must not reach the
  parent's watcher through the inherited socket.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torchdoctor.telemetry.patches import Hooks

GRACE = 1.0  # seconds the main thread has to start the handler itself
DEADLINE = 15.0  # seconds our handler may take before the signal ends the process regardless
_current: SignalWatch | None = None


class SignalWatch:
    def __init__(self, wanted: Callable[[int], bool], act: Callable[[int], None]) -> None:
        self.wanted = wanted
        self.act = act
        self.hooks = Hooks()
        self._claim = threading.Lock()
        self._claimed = threading.Event()
        self._real_set_wakeup_fd = signal.set_wakeup_fd
        self._theirs = -1  # the script's wakeup fd, that gets every byte
        self._ours: socket.socket | None = None
        self._reader: socket.socket | None = None

    # -- install / remove -------------------------------------------------------------------
    def start(self) -> bool:
        """On the main thread: become the wakeup fd and start the watcher (False if not)."""
        global _current
        if threading.current_thread() is not threading.main_thread():
            return False
        reader, ours = socket.socketpair()
        ours.setblocking(False)
        try:
            self._theirs = self._real_set_wakeup_fd(ours.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            reader.close()
            ours.close()
            return False
        self._reader, self._ours = reader, ours
        self.hooks.patch(signal, "set_wakeup_fd", self._set_wakeup_fd)
        self.hooks.on_remove(self._restore)
        threading.Thread(target=self._watch, name="torchdoctor-signals", daemon=True).start()
        _current = self
        return True

    def stop(self) -> None:
        self.hooks.remove()

    def _restore(self) -> None:
        global _current
        if _current is self:
            _current = None
        if threading.current_thread() is threading.main_thread():
            self._give_back()  # only the main thread may: elsewhere the sockets stay open

    def _give_back(self) -> None:
        """The script's wakeup fd in place of ours, and our sockets closed (the watcher's recv
        returns: it ends); nothing changed where the fd is not ours any more (set behind our
        back: theirs to keep, and our sockets stay open, their numbers never reused)."""
        try:
            now = self._real_set_wakeup_fd(self._theirs)
            if now != self._fileno():
                self._real_set_wakeup_fd(now)
                return
        except (ValueError, OSError):
            return
        for sock in (self._ours, self._reader):
            if sock is not None:
                sock.close()

    def _fileno(self) -> int:
        try:
            return self._ours.fileno() if self._ours is not None else -1
        except OSError:
            return -1

    def forget_in_child(self) -> None:
        """After fork, in the child (whose main thread is the forking one): its signals are its
        own, and the inherited sockets are closed there."""
        global _current
        _current = None
        self.hooks = Hooks()  # the parent's patches stay; this child leaves them alone
        self._give_back()
        self._ours = self._reader = None

    # -- the script's view ---------------------------------------------------------------------
    def _set_wakeup_fd(self, fd: Any, *, warn_on_full_buffer: bool = True) -> int:
        if threading.current_thread() is not threading.main_thread() or self._ours is None:
            return self._real_set_wakeup_fd(fd, warn_on_full_buffer=warn_on_full_buffer)
        # Theirs for a moment, so that a bad fd raises what it raises without us; then ours.
        self._real_set_wakeup_fd(fd, warn_on_full_buffer=warn_on_full_buffer)
        self._real_set_wakeup_fd(self._ours.fileno(), warn_on_full_buffer=False)
        previous, self._theirs = self._theirs, int(fd)
        return previous

    # -- the two sides of a signal ---------------------------------------------------------
    def claim_on_main_thread(self) -> bool:
        """Our handler, on the main thread, is about to end the process: False when the
        watcher already does (the caller then waits for the end)."""
        if not self._claim.acquire(blocking=False):
            return False
        self._claimed.set()
        return True

    def _watch(self) -> None:
        reader = self._reader
        assert reader is not None  # started by start(), after the sockets
        while True:
            try:
                data = reader.recv(512)
            except OSError:
                return
            if not data:
                return
            if self._theirs >= 0:
                try:
                    os.write(self._theirs, data)
                except OSError:
                    pass  # a full pipe loses bytes without us too
            for signum in set(data):
                if self.wanted(signum):
                    threading.Thread(
                        target=self._end_if_main_cannot, args=(signum,), daemon=True
                    ).start()

    def _end_if_main_cannot(self, signum: int) -> None:
        if self._claimed.wait(GRACE) or not self._claim.acquire(blocking=False):
            _die_after(DEADLINE, signum)  # the main thread's handler is on it
            return
        threading.Thread(target=_die_after, args=(DEADLINE, signum), daemon=True).start()
        try:
            self.act(signum)
        finally:
            die_by(signum)


def _die_after(seconds: float, signum: int) -> None:
    """Saving the ending takes well under a second (the flush gives up after two). Still here
    much later, it is stuck in our code: the process ends anyway, by the signal, as it would
    have without us."""
    time.sleep(seconds)
    sys.stderr.write(f"torchdoctor: saving the ending took over {seconds:g} s\n")
    die_by(signum)


def die_by(signum: int) -> None:
    """End the process by `signum`'s default disposition from any thread (`signal.signal` is
    for the main thread only; libc's is not)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signum, ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signum)
    finally:
        os._exit(128 + signum)  # not reached where the kill above ends the process


def _forget_in_child() -> None:
    watch = _current
    if watch is not None:
        watch.forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
