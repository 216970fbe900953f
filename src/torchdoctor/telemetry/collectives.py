"""python.collectives: every collective and point-to-point call of torch.distributed, the ones
DDP and FSDP issue themselves included, one row each.

Where they are seen: every ProcessGroup call goes through torch's dispatcher as a `c10d::` op
(allreduce_, broadcast_, _allgather_base_, send, ...), whether Python called it (dist.all_reduce,
FSDP) or C++ did (DDP's Reducer, on its gradient buckets). A Python kernel is registered for
those ops at the BackendSelect key: it runs just before the backend kernel, for every caller,
and redispatches to it unchanged. Nothing of the user's is replaced (no DDP comm hook, no
wrapper process group), and tensor subclasses and fake tensors are handled above that key, so a
compiled region's tracing never reaches it.

Where the C++ kernel is built (`python -m torchdoctor.native`), that kernel is registered
instead of this module's Python one and records the same rows for a fraction of the cost per
call (telemetry/collectives_native.py); this module's kernel is the one that runs everywhere
else (no compiler, another torch, TORCHDOCTOR_NATIVE=0).

What a call records, before it is passed on: the row, written through to the run directory
(store/journal.py) so that a rank the backend aborts (gloo and NCCL end it with SIGABRT) has the
fatal call on disk. When it ends: when its work is seen completed, without a duration (the
moment it completed is not seen). Works are polled off the training thread: by the spill thread
every second (before it writes the ends), whenever the rank tells its state to the job, and
before a live query reads the table; so a rank stopped between two calls (a read that never
returns) does not keep its last, long completed call pending. The training thread polls only
when the works held pass a bound (their count, or the bytes of their tensors: a work keeps its
tensors alive). Synchronous calls end when they return.

`seq` counts the calls of each process group in issue order, from the group's own counter at
the first call seen (so a probe started late still lines up with the other ranks); sends and
receives are numbered per peer instead (the k-th send from A to B pairs with B's k-th receive
from A), so that point-to-point traffic between some ranks does not shift the group's numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import sys
import threading
import time
import weakref
from typing import Any

import torch

from torchdoctor import native
from torchdoctor._failsafe import Switch
from torchdoctor.frames import site, user_frame
from torchdoctor.store import journal
from torchdoctor.telemetry import invisible, process_group
from torchdoctor.telemetry.c10d_ops import OPS, OpSpec, group_facts
from torchdoctor.telemetry.invisible import compiling
from torchdoctor.telemetry.patches import Hooks

_now = time.perf_counter


ISSUED, COMPLETED, FAILED = journal.ISSUED_STATE, journal.COMPLETED, journal.FAILED
# The training thread polls only past these bounds (DDP issues its calls mid-backward and a
# step's end follows the optimizer: there a poll costs ~50 us per work, the caches cold; the
# spill thread polls a second's works in one go): works held, and bytes of their tensors times
# the group's size for a gather (its output), since a work keeps its tensors alive: a script
# that frees each gathered output at once (ZeRO-3) keeps at most this much more.
POLL_AT = 64
HELD_BYTES = 256 << 20  # (the C++ kernel is told the same bounds)


@dataclasses.dataclass
class GroupInfo:
    label: str  # 'default', or "<name> [global ranks]"
    ranks: list[int]  # global rank of each group rank
    seq: Any  # itertools.count: next() is atomic, callers may be on several threads
    p2p: dict[tuple[str, int | None], Any] = dataclasses.field(default_factory=dict)
    # the journal line's fixed parts, per op: '"<group>",' and ',"<op>",'
    encoded: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # the id of its latest call seen completed (not point-to-point): every call of the group
    # issued before it is over too (the group's calls end in order), seen or not
    completed_upto: int = -1

    def encode(self, op: str) -> tuple[str, str]:
        parts = self.encoded.get(op)
        if parts is None:
            parts = self.encoded[op] = (json.dumps(self.label), json.dumps(op))
        return parts

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank] if 0 <= group_rank < len(self.ranks) else group_rank


class Collectives:
    """Turns c10d calls into python.collectives rows (see the module's docstring)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.table = rec.tables.journal("collectives")
        self.switch = Switch("collective tracing")
        self._groups: weakref.WeakKeyDictionary[Any, GroupInfo] = weakref.WeakKeyDictionary()
        # (id, work, bytes, its group when its calls end in order) of calls ended when seen
        # done, and the sum of their bytes
        self.waiting: list[tuple[int, Any, int, GroupInfo | None]] = []
        self.held = 0
        self._polling = threading.Lock()  # the list `waiting`: taken only for a moment
        # one poll at a time, so that a poll that returns (the run's end) has ended every work
        # seen completed, none of them still in another thread's hands; reentrant, since a
        # signal's handler may flush the tables (and poll) in the middle of a poll
        self._one_poll = threading.RLock()
        self._lock = threading.Lock()  # group creation only
        self._last: tuple[Any, Any] = (_nobody, None)  # (weak ref to a group, its GroupInfo)
        from torch._C._distributed_c10d import ProcessGroup, Work

        self._unbox_group = ProcessGroup.unbox
        self._unbox_work = Work.unbox

    def on(self) -> bool:
        return self.switch.on and self.rec.switch.on

    # -- the kernel's two halves ---------------------------------------------------------------
    def issued(
        self, spec: OpSpec, args: tuple[Any, ...]
    ) -> tuple[int, float, int, GroupInfo | None]:
        """Record the call (on disk before it goes on): its id, start, the bytes its work will
        hold and its group (None for a point-to-point call, numbered per peer). Every c10d
        call pays for this, hence the caches and the journal line written by hand."""
        process_group.poll()  # the rank and job directory first: this may be the first call
        if len(self.waiting) >= POLL_AT or self.held >= HELD_BYTES:
            self.poll(errors=False, wait=False)  # the works held stay few and small
        info = self._group(args[spec.group])
        facts = _facts(args[spec.inputs]) if spec.inputs is not None else _NO_TENSORS
        peer = None
        if spec.peer is not None:
            peer = info.global_rank(int(args[spec.peer]))
        if spec.p2p:
            key = (spec.name, peer)
            counter = info.p2p.get(key)
            if counter is None:
                counter = info.p2p.setdefault(key, itertools.count())
            seq = next(counter)
        else:
            seq = next(info.seq)
        rec = self.rec
        step, rank, where, ns = rec.step, rec.rank, self._site(), time.time_ns()
        row = (step, info.label, seq, spec.name, facts[0], facts[1], facts[2], peer, ns / 1e9,
               None, ISSUED, where, rank)  # fmt: skip
        group, op = info.encode(spec.name)
        # the start as JSON's "<integer>e-9": formatting an int costs a third of a float's
        encoded = (
            f"{step},{group},{seq},{op},{facts[3]},{facts[2]},"
            f'{"null" if peer is None else peer},{ns}e-9,null,"{ISSUED}",{_quoted(where)},{rank}'
        )
        held = facts[2] * len(info.ranks) if spec.gathers else facts[2]
        return self.table.issue(row, encoded), _now(), held, None if spec.p2p else info

    def returned(
        self, rid: int, t0: float, nbytes: int, out: Any, group: GroupInfo | None = None
    ) -> None:
        """The backend took the call: end it when its work is seen completed (at the next
        poll; a Python callback on the backend's thread would cost a GIL hand-over per call)."""
        work = out[1] if isinstance(out, tuple) else out
        if work is None:  # synchronous (monitored_barrier): over already
            self.table.end(rid, _now() - t0, COMPLETED)
            return
        with self._polling:
            self.waiting.append((rid, work, nbytes, group))  # unboxed when polled
            self.held += nbytes

    def failed(self, rid: int, t0: float) -> None:
        self.table.end(rid, _now() - t0, FAILED)

    def poll(self, errors: bool = True, wait: bool = True) -> None:
        """End the calls whose work is seen completed (their duration is not known: the
        moment they completed was not seen); with `errors`, `failed` when the work ended in an
        error. Any thread: is_completed() does not block.

        The training thread polls without `errors`: reading a work's error lets the GIL go
        (Future.value()), and the training thread may then wait for another thread to give it
        back (12-30 us a call inside a DDP job). What it loses is small: it polls only past the
        bounds, and the other polls (the spill thread's, the job's, the run's end) check.
        Without `wait`, a poll already under way on another thread is left to do the work."""
        if not self._one_poll.acquire(blocking=wait):
            return
        try:
            with self._polling:  # the list taken whole: `returned` never waits for a poll
                works, self.waiting, self.held = self.waiting, [], 0
            pending = []
            for rid, work, nbytes, group in works:
                try:
                    if type(work) is torch.ScriptObject:  # as the kernel got it
                        work = self._unbox_work(work)
                    done = work.is_completed()
                except Exception:
                    done = True
                if done:
                    failed = errors and _raised(work)
                    self.table.end(rid, None, FAILED if failed else COMPLETED)
                    if group is not None and not failed and rid > group.completed_upto:
                        group.completed_upto = rid
                else:
                    pending.append((rid, work, nbytes, group))
            # A work a backend never marks completed (gloo's reduce-scatter under FSDP2) would
            # be held, its tensors with it, for ever: it is over once a later call of its group
            # completed (the table has ended its row by the same rule)
            pending = [w for w in pending if w[3] is None or w[0] > w[3].completed_upto]
            if pending:
                with self._polling:
                    self.waiting[:0] = pending  # oldest first, before those issued meanwhile
                    self.held += sum(w[2] for w in pending)
        finally:
            self._one_poll.release()

    def held_works(self) -> int:
        """How many works are held for polling, after a poll (tests: none for ever)."""
        self.poll(errors=False)
        with self._polling:
            return len(self.waiting)

    def settle(self) -> None:
        """poll() for the other threads (the spill thread's second): never raises."""
        try:
            self.poll()
        except Exception as exc:
            self.switch.fail(exc)

    # -- helpers ---------------------------------------------------------------------------------
    def _group(self, boxed: Any) -> GroupInfo:
        pg = self._unbox_group(boxed)
        last_ref, info = self._last  # most calls are on the group of the call before
        if last_ref() is pg:
            return info
        info = self._groups.get(pg)
        if info is None:
            with self._lock:
                info = self._groups.get(pg)
                if info is None:
                    info = self._groups[pg] = _describe(pg)
        self._last = (weakref.ref(pg), info)  # weak: a destroyed group is not kept alive
        return info

    def _site(self) -> str | None:
        frame = user_frame(sys._getframe(2))
        if frame is not None:
            return site(frame)
        # A backward on another thread (CUDA autograd): the training thread's backward() call.
        state = getattr(self.rec, "state", None)
        where = getattr(state, "backward_site", None)
        return f"{where[0]}:{where[1]}" if where else None


def _nobody() -> None:
    return None


def _raised(work: Any) -> bool:
    """Whether a completed work ended in an error (gloo: a peer went away while this rank
    waited), read from its future: Work.exception() and is_success() print deprecation
    warnings into the script's output."""
    try:
        future = work.get_future()
    except Exception:  # a backend without futures: no way to tell
        return False
    try:
        future.value()
    except Exception:
        return True
    return False


def _describe(pg: Any) -> GroupInfo:
    label, ranks, start = group_facts(pg)
    return GroupInfo(label, ranks, itertools.count(start))


# (shapes, dtype, bytes, and the first two as JSON for the journal line) of a call's tensors
Facts = tuple[str | None, str | None, int, str]
_NO_TENSORS: Facts = (None, None, 0, "null,null")
_FACTS: dict[Any, Facts] = {}  # by (dtype, shape) of each tensor: the same calls every step
_QUOTED: dict[str | None, str] = {None: "null"}


def _facts(value: Any) -> Facts:
    if type(value) is list and len(value) == 1 and type(value[0]) is torch.Tensor:
        t = value[0]
        key: Any = (t.dtype, t.shape)  # the common case: one tensor (DDP's bucket, all_reduce)
        tensors = value
    else:
        tensors = _tensors(value)
        if not tensors:
            return _NO_TENSORS
        key = tuple((t.dtype, t.shape) for t in tensors)
    facts = _FACTS.get(key)
    if facts is None:
        shapes = _shapes(tensors)
        dtype = str(tensors[0].dtype)[6:]  # 'torch.float32'[6:]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        facts = (shapes, dtype, nbytes, f'"{shapes}","{dtype}"')
        if len(_FACTS) < 10_000:
            _FACTS[key] = facts
    return facts


def _quoted(text: str | None) -> str:
    """`text` as a JSON string, cached (call sites repeat every step)."""
    out = _QUOTED.get(text)
    if out is None:
        out = json.dumps(text)
        if len(_QUOTED) < 10_000:
            _QUOTED[text] = out
    return out


def _shapes(tensors: list[Any]) -> str:
    """JSON list of shapes, e.g. [[65],[8,6]]."""
    return "[" + ",".join(repr(list(t.shape)).replace(" ", "") for t in tensors) + "]"


def _tensors(value: Any) -> list[Any]:
    """The tensors of an argument: a tensor, a list of them, or a list of lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[Any] = []
    for item in value or ():
        out.extend(_tensors(item))
    return out


# -- the kernels: registered once per process, they call whichever Collectives is current --------
_current: list[Any] = []  # Collectives, or the C++ kernel's NativeCollectives
_library: list[Any] = []


def install(rec: Any, hooks: Hooks) -> Any:
    """Record collectives for `rec` (removed with `hooks`): with the C++ kernel where it is
    built (telemetry/collectives_native.py), else with this module's Python kernel."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    lib = native.load()  # the compiled module
    if lib is not None:
        from torchdoctor.telemetry import collectives_native

        installed = collectives_native.install(rec, hooks, lib, (POLL_AT, HELD_BYTES))
        if installed is not None:
            _current[:] = [installed]
            hooks.on_remove(functools.partial(_forget, installed))
            return installed
    collectives = Collectives(rec)
    collectives.table.settle = collectives.settle  # the spill thread's second polls the works
    _current[:] = [collectives]
    if not _library:
        _library.append(_register())
    hooks.on_remove(functools.partial(_uninstall, collectives))
    return collectives


def set_kernels(on: bool) -> None:
    """Register or drop the kernels, the current Collectives kept (benchmarks/ddp_overhead.py
    compares steps with and without them)."""
    current = _current[0] if _current else None
    if current is not None and not isinstance(current, Collectives):  # the C++ kernel's
        from torchdoctor.telemetry import collectives_native

        collectives_native.set_kernels(current.kernels, on)
        return
    if on and not _library:
        _library.append(_register())
    elif not on and _library:
        _library.pop()._destroy()


def _forget(collectives: Any) -> None:
    if _current and _current[0] is collectives:
        _current.clear()


def _uninstall(collectives: Collectives) -> None:
    if collectives.table.settle == collectives.settle:
        collectives.table.settle = None
    if _current and _current[0] is collectives:
        _current.clear()
        if _library:
            _library.pop()._destroy()


def _register() -> Any:
    after = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
    library = torch.library.Library("c10d", "IMPL")
    for name, spec in OPS.items():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None:  # an op this torch does not have
            continue
        # the handle's own redispatch: OpOverload.redispatch is one more Python frame per call
        kernel = functools.partial(_kernel, packet.default._handle.redispatch_boxed, spec, after)
        library.impl(name, kernel, "BackendSelect", with_keyset=True)
    return library


def _kernel(redispatch: Any, spec: OpSpec, after: Any, keyset: Any, *args: Any) -> Any:
    keys = keyset & after
    collectives = _current[0] if _current else None
    if collectives is None or compiling() or not collectives.on():
        return redispatch(keys, *args)
    try:
        rid, t0, nbytes, group = collectives.issued(spec, args)
    except Exception as exc:
        collectives.switch.fail(exc)
        return redispatch(keys, *args)
    try:
        out = redispatch(keys, *args)
    except BaseException:
        _guarded(collectives, collectives.failed, rid, t0)
        raise
    try:  # _guarded's work, inline: this path runs on every call
        collectives.returned(rid, t0, nbytes, out, group)
    except Exception as exc:
        collectives.switch.fail(exc)
    return out


def _guarded(collectives: Collectives, method: Any, *args: Any) -> None:
    try:
        method(*args)
    except Exception as exc:
        collectives.switch.fail(exc)


invisible.skip_frames(_kernel, _guarded, Collectives.issued, Collectives.returned)
invisible.skip_frames(Collectives.poll)
