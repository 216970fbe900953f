"""python.collectives recorded by the C++ kernel (torchdoctor/native/collectives.cpp), wherever
it is built (TORCHDOCTOR_NATIVE=0 to use the Python one): the same rows as
telemetry/collectives.py's Python kernel, for a fraction of the cost per call
(docs/benchmarks.md).

The kernel does the per-call work in C++ and writes the journal itself; this side tells it the
ops (collectives.OPS, the one table of them), answers what lives in Python when the kernel asks
(a group's label, ranks and first number, once per group; which files are the user's, once per
code object; the backward's line for a call on a thread without Python), and reads the journal
back into the table for live queries (store/journal.py: JournalTable.follow).

What differs from the Python kernel: a call on CPU tensors ends when the backend completes its
future, so its duration is known and its end is on disk at once (at the latest ahead of the
next call's line: the future wakes its waiters before its callbacks run); calls whose future
completes early (NCCL marks it at launch) or that have none (gloo's send and recv) are polled
as before.
"""

from __future__ import annotations

import ctypes
import functools
import json
from typing import Any

import torch

from torchdoctor._failsafe import Switch
from torchdoctor.frames import _kind
from torchdoctor.telemetry import process_group
from torchdoctor.telemetry.c10d_ops import OPS, group_facts
from torchdoctor.telemetry.patches import Hooks

_registered: list[Any] = []  # the library whose kernels are registered now
_told_ops = [False]  # the kernel knows collectives.OPS (told once per process)


class NativeCollectives:
    """The Python half of the C++ kernel, for one run."""

    def __init__(self, rec: Any, lib: ctypes.PyDLL, poll: Any) -> None:
        self.rec = rec
        self.lib = lib
        self.table = rec.tables["collectives"]
        self.switch = Switch("collective tracing")
        self._poll = poll  # td_poll, the GIL let go

    # -- called by the kernel, the GIL held; never raise ------------------------------------------
    def prepare(self, group_name: str, size: int) -> tuple[str, list[int], int] | None:
        """A group's first call: its label (as JSON), global ranks and first number; the
        journal opened on the first call of all. None: do not record."""
        try:
            process_group.poll()  # the rank and job directory first: this may be the first call
            if not self.lib.td_is_open():
                path = self.table.follow(self.close)
                if path is None or self.lib.td_open(str(path).encode()) != 0:
                    # The kernel keeps no rows of its own: without its journal it records
                    # nothing (the Python kernel would keep them in memory), and says so.
                    self.switch.fail(OSError(f"cannot write the collectives journal {path}"))
                    return None
            try:
                resolve = torch._C._distributed_c10d._resolve_process_group
                label, ranks, start = group_facts(resolve(group_name))  # type: ignore[arg-type]
            except Exception:  # a group torch does not know by its name: its name and size
                label, ranks, start = f"{group_name} [?]", list(range(size)), 0
            return json.dumps(label), ranks, start
        except Exception as exc:
            self.switch.fail(exc)
            return None

    def fallback_site(self) -> str | None:
        """A call on a thread without Python (a CUDA backward): the training thread's backward()."""
        where = getattr(getattr(self.rec, "state", None), "backward_site", None)
        return f"{where[0]}:{where[1]}" if where else None

    # -- the rest of the process ------------------------------------------------------------------
    def poll(self, errors: bool = True) -> None:
        """End the calls whose polled works completed (the kernel's own list); then say what
        turned the kernel off, if something did."""
        self._poll(1 if errors else 0)
        failure = self.lib.td_take_failure()
        if failure:
            self.switch.fail(RuntimeError(failure.decode(errors="replace")))

    def settle(self) -> None:
        try:
            self.poll()
        except Exception as exc:
            self.switch.fail(exc)

    def close(self) -> None:
        """The run's end (JournalTable.close): the last works ended, the journal closed."""
        self.settle()
        self.lib.td_close()


def install(
    rec: Any, hooks: Hooks, lib: ctypes.PyDLL, poll: Any, bounds: tuple[int, int]
) -> NativeCollectives | None:
    """Record collectives for `rec` with the C++ kernel; None if it cannot be registered.
    `bounds`: the works held for polling, in number and in bytes, before the calling thread
    polls (telemetry/collectives.py, POLL_AT and HELD_BYTES)."""
    collectives = NativeCollectives(rec, lib, poll)
    if not _told_ops[0]:
        _told_ops[0] = True
        for name, spec in OPS.items():
            lib.td_add_op(
                name.encode(), spec.name.encode(),
                -1 if spec.inputs is None else spec.inputs, spec.group,
                -1 if spec.peer is None else spec.peer, int(spec.p2p), int(spec.gathers),
            )  # fmt: skip
    lib.td_set_bounds(*bounds)
    if not _registered:
        if lib.td_register() != 0:
            return None
        _registered.append(lib)
    lib.td_configure(rec, collectives.switch, collectives.prepare, _kind, collectives.fallback_site)
    lib.td_enable(1)
    collectives.table.settle = collectives.settle  # the spill thread's second polls the works
    hooks.on_remove(functools.partial(_uninstall, collectives))
    return collectives


def set_kernels(lib: ctypes.PyDLL, on: bool) -> None:
    """Register or drop the kernels (benchmarks/ddp_overhead.py, between two steps of one
    thread: no call is inside a kernel when it is dropped)."""
    if on and not _registered:
        if lib.td_register() == 0:
            _registered.append(lib)
            lib.td_enable(1)
    elif not on and _registered:
        _registered.pop().td_unregister()


def _uninstall(calls: NativeCollectives) -> None:
    if calls.table.settle == calls.settle:
        calls.table.settle = None
    # Off, not unregistered: a call on another thread may be inside the kernel this instant,
    # and the dispatcher does not keep a kernel alive for the calls in it. Off, the kernel
    # passes every call straight on (as cheap as no kernel: docs/benchmarks.md). The journal
    # closes with the run (JournalTable.close).
    calls.lib.td_enable(0)
