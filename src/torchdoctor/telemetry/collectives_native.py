"""python.collectives recorded by the C++ kernel (torchdoctor/native/collectives.cpp), wherever
it is built (TORCHDOCTOR_NATIVE=0 to use the Python one): the same rows as
telemetry/collectives.py's Python kernel, for a fraction of the cost per call
(docs/benchmarks.md).

The kernel does the per-call work in C++ and writes the journal itself, in the layout that
store/journal.py and the schema define (native/layout.py generates its header from them). This
side tells it the ops (c10d_ops.OPS, the one table of them), answers the few facts that live
only in Python through KernelHost, whose public methods it is given once per run, and reads the
journal back into the table for live queries (store/journal.py: JournalTable.follow).

What differs from the Python kernel: a call on CPU tensors ends when the backend completes its
future, so its duration is known and its end is on disk at once (at the latest ahead of the
next call's line: the future wakes its waiters before its callbacks run); calls whose future
completes early (NCCL marks it at launch) or that have none (gloo's send and recv) are polled
as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor import frames
from torchdoctor._failsafe import Switch
from torchdoctor.native import Kernels
from torchdoctor.store.journal import JournalTable
from torchdoctor.telemetry import process_group
from torchdoctor.telemetry.c10d_ops import OPS, group_facts
from torchdoctor.telemetry.patches import Hooks

_registered: list[Kernels] = []  # the module whose kernels are registered now


class KernelHost:
    """What the C++ kernel asks Python, one public method per fact (native/collectives.cpp's
    Host says when each is asked and why it is Python's). Called with the GIL held; none
    raises: a failure turns collective tracing off and says why."""

    def __init__(
        self, rec: Any, table: JournalTable, switch: Switch, close: Callable[[], None]
    ) -> None:
        self.rec = rec  # the Recorder: its step, its switch, the backward() line
        self.table = table
        self.switch = switch  # collective tracing's own
        self._close = close

    def step(self) -> int | None:
        """Every call: the step in progress; None while recording is off."""
        rec = self.rec
        return rec.step if self.switch.on and rec.switch.on else None

    def journal(self) -> str | None:
        """The run's first call: the journal file to append to; None to record nothing."""
        try:
            process_group.poll()  # the rank and job directory first
            path = self.table.follow(self._close)
            if path is None:
                # The kernel keeps no rows of its own: without its journal it records nothing
                # (the Python kernel would keep them in memory), and says so.
                self.switch.fail(OSError("no run directory for the collectives journal"))
                return None
            return str(path)
        except Exception as exc:
            self.switch.fail(exc)
            return None

    def group(self, name: str, size: int) -> tuple[str, list[int], int] | None:
        """A group's first call: its label, the global rank of each group rank, its first
        number (c10d_ops.group_facts, as the Python kernel says them); None: do not record."""
        try:
            process_group.poll()
            try:
                resolve = torch._C._distributed_c10d._resolve_process_group
                return group_facts(resolve(name))  # type: ignore[arg-type]
            except Exception:  # a group torch does not know by its name: its name and size
                return f"{name} [?]", list(range(size)), 0
        except Exception as exc:
            self.switch.fail(exc)
            return None

    def backward_site(self) -> str | None:
        """A call on a thread without Python (a CUDA backward): the training thread's
        backward() line."""
        where = getattr(getattr(self.rec, "state", None), "backward_site", None)
        return f"{where[0]}:{where[1]}" if where else None


class NativeCollectives:
    """The Python half of the C++ kernel, for one run."""

    def __init__(self, rec: Any, kernels: Kernels) -> None:
        self.kernels = kernels
        self.table = rec.tables.journal("collectives")
        self.switch = Switch("collective tracing")
        self.host = KernelHost(rec, self.table, self.switch, self.close)

    def poll(self, errors: bool = True) -> None:
        """End the calls whose polled works completed (the kernel's own list); then say what
        turned the kernel off, if something did."""
        self.kernels.poll(errors)
        failure = self.kernels.take_failure()
        if failure:
            self.switch.fail(RuntimeError(failure))

    def held_works(self) -> int:
        """How many works the kernel holds for polling, after a poll (tests: none for ever)."""
        return int(self.kernels.poll(False))

    def settle(self) -> None:
        try:
            self.poll()
        except Exception as exc:
            self.switch.fail(exc)

    def close(self) -> None:
        """The run's end (JournalTable.close): the last works ended, the journal closed."""
        self.settle()
        self.kernels.close()


def install(
    rec: Any, hooks: Hooks, kernels: Kernels, bounds: tuple[int, int]
) -> NativeCollectives | None:
    """Record collectives for `rec` with the C++ kernel; None if it cannot be registered.
    `bounds`: the works held for polling, in number and in bytes, before the calling thread
    polls (telemetry/collectives.py, POLL_AT and HELD_BYTES)."""
    collectives = NativeCollectives(rec, kernels)
    kernels.set_bounds(*bounds)
    if not _registered:
        if not kernels.register(_ops()):
            return None
        _registered.append(kernels)
    host = collectives.host
    kernels.configure(
        step=host.step,
        journal=host.journal,
        group=host.group,
        file_kind=frames.file_kind,
        backward_site=host.backward_site,
    )
    kernels.enable(True)
    collectives.table.settle = collectives.settle  # the spill thread's second polls the works
    hooks.on_remove(functools.partial(_uninstall, collectives))
    return collectives


def _ops() -> list[tuple[str, str, int, int, int, bool, bool]]:
    """c10d_ops.OPS as the kernel reads it (-1: the op has no such argument)."""
    return [
        (c10d, spec.name, -1 if spec.inputs is None else spec.inputs, spec.group,
         -1 if spec.peer is None else spec.peer, spec.p2p, spec.gathers)
        for c10d, spec in OPS.items()
    ]  # fmt: skip


def set_kernels(kernels: Kernels, on: bool) -> None:
    """Register or drop the kernels (benchmarks/ddp_overhead.py, between two steps of one
    thread: no call is inside a kernel when it is dropped)."""
    if on and not _registered:
        if kernels.register(_ops()):
            _registered.append(kernels)
            kernels.enable(True)
    elif not on and _registered:
        _registered.pop().unregister()


def _uninstall(calls: NativeCollectives) -> None:
    if calls.table.settle == calls.settle:
        calls.table.settle = None
    # Off, not unregistered: a call on another thread may be inside the kernel this instant,
    # and the dispatcher does not keep a kernel alive for the calls in it. Off, the kernel
    # passes every call straight on (as cheap as no kernel: docs/benchmarks.md). The journal
    # closes with the run (JournalTable.close).
    calls.kernels.enable(False)
