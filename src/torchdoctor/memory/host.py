"""What the host's memory allows this process: one reader of /proc and the cgroup limit, for
the OOM capture and the batch-size finder alike.

`available` is what this process may still take: the least of the RAM the kernel reports
available (MemAvailable), the room left under the address-space limit (RLIMIT_AS) and the
room left under the cgroup's memory limit.
"""

from __future__ import annotations

import resource
from typing import Any


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def status_fields() -> dict[str, int]:
    """The process's Vm* lines of /proc/self/status (VmRSS, VmHWM, VmSize, ...) in bytes."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key.startswith("Vm") and parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def cgroup_room() -> tuple[int | None, int | None]:
    """(limit, room left) of the cgroup v2 memory limit, when there is one."""
    try:
        limit_text = open("/sys/fs/cgroup/memory.max").read().strip()  # noqa: SIM115
        current = int(open("/sys/fs/cgroup/memory.current").read().strip())  # noqa: SIM115
    except (OSError, ValueError):
        return None, None
    if not limit_text.isdigit():
        return None, None
    return int(limit_text), max(0, int(limit_text) - current)


def host_memory() -> dict[str, Any]:
    """What this process may still take from the host: RAM, address-space limit, cgroup."""
    info = meminfo()
    status = status_fields()
    rss = status.get("VmRSS", 0)
    rooms: dict[str, int] = {}
    if "MemAvailable" in info:
        rooms["ram"] = info["MemAvailable"]
    limit = None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            limit = int(soft)
            rooms["address_space_limit"] = max(0, limit - status.get("VmSize", 0))
    except (OSError, ValueError):
        pass
    cg_limit, cg_room = cgroup_room()
    if cg_room is not None:
        rooms["cgroup"] = cg_room
    available = min(rooms.values()) if rooms else None
    return {
        "total": info.get("MemTotal"),
        "available": available,
        "limited_by": min(rooms, key=lambda k: rooms[k]) if rooms else None,
        "rss": rss,
        "vm_size": status.get("VmSize"),
        "rlimit_as": limit,
        "cgroup_limit": cg_limit,
        "capacity": (rss + available) if available is not None else info.get("MemTotal"),
    }


def available() -> int | None:
    """What this process may still take from the host, in bytes (None when unknown)."""
    value = host_memory()["available"]
    return int(value) if value is not None else None
