"""When a process becomes a rank: `init_process_group` returning tells who it is.

The wrapper calls the original first and, once it has returned, hands the rank's identity
(global rank, world size, the rendezvous it used) to a callback: the session updates its rank
and moves its record into the job directory, or, in a launched child that has no probe yet
(torch.multiprocessing.spawn, see torchdoctor.autostart), starts one. The same wrapper is put
everywhere torch binds the name (torch.distributed, distributed_c10d, device_mesh's import).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._failsafe import warn_once
from torchdoctor.identity import RankIdentity, from_process_group
from torchdoctor.telemetry import invisible
from torchdoctor.telemetry.invisible import compiling
from torchdoctor.telemetry.patches import Hooks

OnRank = Callable[[RankIdentity], None]
_OWNERS = (
    "torch.distributed",
    "torch.distributed.distributed_c10d",
    "torch.distributed.device_mesh",  # init_device_mesh calls its own import of the name
)

_hooks = Hooks()
_lock = threading.Lock()
_callback: list[OnRank] = []
_told = [False]  # the callback has heard of the current default group


def install(on_rank: OnRank) -> None:
    """Wrap init_process_group (once per process; a later call changes the callback), and
    tell `on_rank` at once when the default group exists already (a probe started late)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    with _lock:
        _callback[:] = [on_rank]
        if not len(_hooks):
            c10d = dist.distributed_c10d
            original = c10d.init_process_group

            @functools.wraps(original)
            def init_process_group(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                if not compiling():
                    _tell()
                return out

            for name in _OWNERS:
                owner = sys.modules.get(name)
                if owner is not None and getattr(owner, "init_process_group", None) is original:
                    _hooks.patch(owner, "init_process_group", init_process_group)
            invisible.skip_own_frames(init_process_group)
    if dist.is_initialized():
        _tell()


def poll() -> None:
    """Tell the callback now if the default group came up unseen: the probe may have been put
    in place while the script was already inside init_process_group (TORCHDOCTOR=1 installs
    the telemetry on a side thread right after `import torch`)."""
    if _told[0] or not _callback:
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        _tell()


def remove() -> None:
    with _lock:
        _hooks.remove()
        _callback.clear()
        _told[0] = False


def current_identity() -> RankIdentity | None:
    """This rank's identity from the default process group (None before there is one)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    method = getattr(dist.distributed_c10d, "_default_pg_init_method", None)
    method = method if isinstance(method, str) else None
    return from_process_group(dist.get_rank(), dist.get_world_size(), method)


def _tell() -> None:
    try:
        identity = current_identity()
        callbacks = list(_callback)
        if identity is not None:
            _told[0] = True
            for callback in callbacks:
                callback(identity)
    except Exception as exc:  # never fail the user's init_process_group
        warn_once("rank-identity", f"rank identity not recorded: {type(exc).__name__}: {exc}")


invisible.skip_frames(_tell, poll)
