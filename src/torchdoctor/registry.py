"""The per-user directory of probed processes: <pid>.sock and <pid>.json for each.

The directory is 0700 and must belong to the user; anything else (another owner, a symlink,
looser permissions) is refused rather than repaired, since someone else may have planted it.
Used by the probe (to register) and by the CLI (to find endpoints): it imports neither.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

ENV_DIR = "TORCHDOCTOR_SOCKET_DIR"


class InsecureDirectory(Exception):
    pass


def base_dir() -> Path:
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return Path(runtime) / "torchdoctor"
    return Path(tempfile.gettempdir()) / f"torchdoctor-{os.getuid()}"


def ensure_dir() -> Path:
    path = base_dir()
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    check_dir(path)
    return path


def check_dir(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise InsecureDirectory(f"{path} is not a directory (a symlink?); refusing to use it")
    if st.st_uid != os.getuid():
        raise InsecureDirectory(f"{path} belongs to uid {st.st_uid}, not to you; refusing it")
    if st.st_mode & 0o077:
        raise InsecureDirectory(
            f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
            "it must be 0700: chmod 700 it or remove it"
        )


def socket_path(pid: int) -> Path:
    return base_dir() / f"{pid}.sock"


def entry_path(pid: int) -> Path:
    return base_dir() / f"{pid}.json"


def register(pid: int, entry: dict[str, Any]) -> Path:
    directory = ensure_dir()
    path = directory / f"{pid}.json"
    tmp = directory / f".{pid}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)
    return path


def unregister(pid: int) -> None:
    for path in (entry_path(pid), socket_path(pid)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entries(prune: bool = True) -> list[dict[str, Any]]:
    """Registered processes that are still alive, by pid; stale files of dead ones removed."""
    directory = base_dir()
    if not directory.is_dir():
        return []
    check_dir(directory)
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(pid):
            if prune:
                unregister(pid)
            continue
        out.append(entry)
    out.sort(key=lambda e: int(e["pid"]))
    return out


def find(pid: int) -> dict[str, Any] | None:
    try:
        entry = json.loads(entry_path(pid).read_text())
    except (OSError, ValueError):
        return None
    return dict(entry) if alive(pid) else None
