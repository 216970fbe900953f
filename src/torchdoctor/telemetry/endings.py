"""How a probed process ends when a signal ends it: the run's record says so, its tables are
saved first, and the process goes exactly as it would have gone without torchdoctor.

SIGTERM and SIGHUP (what schedulers, torchrun and a closed terminal send): a handler of ours
tells the session (`on_signal`), then passes the signal on: to the script's own handler if it
set one (its exit code stays its own), else to the default disposition, re-raised, so that the
exit status is the signal's. The script's `signal.signal` / `signal.getsignal` calls see only
their own handlers: ours stays installed in front of theirs (see `_signal`).

A handler in Python runs only when the main thread runs Python: while it waits in C (a
collective whose peer is stuck) a SIGTERM would wait with it, where without us it ends the
process at once. The signal watcher (signal_watch.py) sees the signal from a thread of ours and,
if the main thread has not started the handler within a second, saves the ending and lets the
default disposition end the process from there.

SIGINT: left alone while it has Python's default handler (KeyboardInterrupt reaches the
session's excepthook and the exit path, which record `interrupted`); a handler the script sets
is wrapped like SIGTERM's.

SIGABRT and the other fatal signals (gloo and NCCL abort a rank with abort(); a segfault): no
Python runs after them, so faulthandler, which works in the signal handler itself, writes the
stacks of every thread to the run directory (rundir.FATAL_FILE) and re-raises the signal; the
readers of the run directory turn a `running` record with that file into `crashed` with the
signal (store/rundir.py). A faulthandler the script enabled itself is left as it is.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchdoctor.store import rundir
from torchdoctor.telemetry.patches import Hooks
from torchdoctor.telemetry.signal_watch import SignalWatch

if TYPE_CHECKING:
    from types import FrameType

# on_signal(signal, phase): GOING, the default disposition ends the process next; PASSED, the
# script's handler comes next (it may end the process its own way); SURVIVED, it returned.
OnSignal = Callable[[int, str], None]
GOING, PASSED, SURVIVED = "going", "passed", "survived"

STATUS: dict[int, str] = {
    signal.SIGTERM: "terminated",
    signal.SIGHUP: "terminated",
    signal.SIGINT: "interrupted",
    signal.SIGABRT: "crashed",
}
_WRAPPED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Endings:
    """Our handlers for SIGTERM/SIGHUP (and a script's SIGINT handler), and the fatal-signal
    file; `remove()` puts back the script's handlers as they are now."""

    def __init__(self, on_signal: OnSignal, on_exit: Callable[[int], None]) -> None:
        self.on_signal = on_signal
        self.on_exit = on_exit  # os._exit(status) ends the process next
        self.pid = os.getpid()
        self.hooks = Hooks()
        self._theirs: dict[int, Any] = {}  # signal -> the handler the script sees as current
        self._fatal: IO[bytes] | None = None
        self._real_signal = signal.signal
        self._real_getsignal = signal.getsignal
        self._real_exit = os._exit
        self._ours = self._handler  # one bound method: compared by identity below
        self._watch: SignalWatch | None = None
        self.installed = False

    # -- install / remove -------------------------------------------------------------------
    def install(self, directory: Path) -> bool:
        """Take over the signals (main thread only: False elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in _WRAPPED:
            current = self._real_getsignal(signum)
            self._theirs[signum] = current
            if _ours_needed(signum, current):
                self._real_signal(signum, self._ours)
        self.hooks.patch(signal, "signal", self._signal)
        self.hooks.patch(signal, "getsignal", self._getsignal)
        self.hooks.patch(os, "_exit", self._os_exit)
        self.hooks.on_remove(self._restore)
        watch = SignalWatch(self._going, lambda signum: self._tell(signum, GOING))
        if watch.start():
            self._watch = watch
            self.hooks.on_remove(watch.stop)
        self.installed = True
        self.fatal_to(directory)
        return True

    def fatal_to(self, directory: Path) -> None:
        """Fatal signals' stacks go to `directory` (again when the record moves)."""
        if not self.installed or (faulthandler.is_enabled() and self._fatal is None):
            return  # the script's own faulthandler (python -X faulthandler, ...)
        try:
            f = open(directory / rundir.FATAL_FILE, "wb")  # noqa: SIM115 - open while we run
            faulthandler.enable(f, all_threads=True)
        except (OSError, RuntimeError, ValueError):
            return
        old, self._fatal = self._fatal, f
        if old is not None:
            old.close()
            _unlink_if_empty(Path(old.name))

    def remove(self) -> None:
        self.hooks.remove()
        self.installed = False

    def _restore(self) -> None:
        if os.getpid() == self.pid and threading.current_thread() is threading.main_thread():
            for signum, theirs in self._theirs.items():
                if self._real_getsignal(signum) is self._ours:
                    self._real_signal(signum, theirs)
        if self._fatal is not None:
            faulthandler.disable()
            self._fatal.close()
            _unlink_if_empty(Path(self._fatal.name))
            self._fatal = None

    # -- the script's view of its handlers ------------------------------------------------
    def _signal(self, signalnum: Any, handler: Any) -> Any:
        signum = _number(signalnum)
        if signum not in self._theirs or threading.current_thread() is not threading.main_thread():
            return self._real_signal(signalnum, handler)  # its own errors, as without us
        if not (callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN)):
            return self._real_signal(signalnum, handler)  # raises TypeError as it would
        previous, self._theirs[signum] = self._theirs[signum], handler
        self._real_signal(signum, self._ours if _ours_needed(signum, handler) else handler)
        return previous

    def _getsignal(self, signalnum: Any) -> Any:
        signum = _number(signalnum)
        if signum in self._theirs and self._real_getsignal(signum) is self._ours:
            return self._theirs[signum]
        return self._real_getsignal(signalnum)

    # -- os._exit: no atexit, no finally after it ----------------------------------------------
    def _os_exit(self, status: int) -> Any:
        """The script ends itself with os._exit (no atexit runs after it): the session saves
        the run first. A forked child's os._exit (multiprocessing's workers end that way) is not
        the run's end: it passes straight through."""
        if os.getpid() == self.pid and isinstance(status, int):
            try:
                self.on_exit(status)
            except Exception:
                pass  # the process ends as asked whatever happened here
        return self._real_exit(status)

    # -- the handler ---------------------------------------------------------------------------
    def _going(self, signum: int) -> bool:
        """Whether `signum` reaches our handler and then the default disposition (any thread)."""
        if signum not in (signal.SIGTERM, signal.SIGHUP) or not self.installed:
            return False
        return self._default_behind(signum) and self._real_getsignal(signum) is self._ours

    def _default_behind(self, signum: int) -> bool:
        """The script left `signum` to its default disposition (ours in front of it)."""
        return self._theirs.get(signum, signal.SIG_DFL) in (signal.SIG_DFL, None)

    def _handler(self, signum: int, frame: FrameType | None) -> Any:
        theirs = self._theirs.get(signum, signal.SIG_DFL)
        going = self._default_behind(signum)
        if going and self._watch is not None and not self._watch.claim_on_main_thread():
            threading.Event().wait()  # the watcher saves the ending and ends the process
        self._tell(signum, GOING if going else PASSED)
        if going:
            self._real_signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)  # the default disposition: the same exit status
            return None
        if theirs is signal.SIG_IGN:
            return None
        out = theirs(signum, frame)  # the script's handler: its exit code, its choices
        self._tell(signum, SURVIVED)  # still here: the script chose to go on
        return out

    def _tell(self, signum: int, phase: str) -> None:
        if os.getpid() != self.pid:  # a forked child (DataLoader worker) is not the run
            return
        try:
            self.on_signal(signum, phase)
        except Exception:
            pass  # the signal goes on its way whatever happened here


def _ours_needed(signum: int, handler: Any) -> bool:
    """Whether our handler goes in front of `handler` (ignored signals stay ignored, and
    Python's own SIGINT handler is followed through the exit path instead)."""
    if handler is signal.SIG_IGN or handler is None:
        return False
    return not (signum == signal.SIGINT and handler is signal.default_int_handler)


def _number(signalnum: Any) -> int:
    try:
        return int(signalnum)
    except (TypeError, ValueError):
        return -1


def _unlink_if_empty(path: Path) -> None:
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
