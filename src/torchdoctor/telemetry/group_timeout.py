"""The default process group's own timeout: a collective that waits longer fails by itself, so
torchdoctor's hang timeout must be shorter to name a stuck rank first.

Read from torch.distributed only when the script has imported it and initialised the default
group (torch is never imported here).
"""

from __future__ import annotations

import sys
from typing import Any

SHARE = 0.5  # the hang timeout is at most this share of the group's timeout

_cache: dict[int, float | None] = {}  # id(default group) -> its timeout


def group_timeout() -> float | None:
    """Seconds the default group's collectives wait before failing (None without one)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.distributed_c10d._get_default_group()
    except Exception:  # being destroyed, or a torch without these
        return None
    key = id(group)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _timeout_of(group)
    return _cache[key]


def _timeout_of(group: Any) -> float | None:
    """The shortest timeout of the group's backends (gloo, NCCL: `options._timeout`)."""
    import torch

    found = []
    for device in getattr(group, "_device_types", None) or [torch.device("cpu")]:
        try:
            options = group._get_backend(device).options
            found.append(float(options._timeout.total_seconds()))
        except Exception:
            continue
    return min(found) if found else None


def hang_limit() -> float | None:
    """The longest hang timeout that still fires before the group's own timeout."""
    timeout = group_timeout()
    return SHARE * timeout if timeout else None
