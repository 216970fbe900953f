"""The run directory: one record format for live and finished runs.

<run_dir>/meta.json         who, what, when, how it ended (rewritten atomically)
<run_dir>/diagnoses.jsonl   one diagnosis per line, written as found
<run_dir>/tables/<t>.seg    every stored table, appended every second
<run_dir>/token             the TCP token, 0600, when --listen was given

A run directory holds the token, stack traces, source lines and values from the training: it is
created 0700 (its parent `torchdoctor-runs/` too, when torchdoctor creates it) and every file in
it 0600, so that other users of the machine can read none of it whatever their umask.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
DIAGNOSES_FILE = "diagnoses.jsonl"
TABLES_DIR = "tables"
TABLE_SUFFIX = ".seg"
TOKEN_FILE = "token"
DEFAULT_PARENT = "torchdoctor-runs"


def default_path(pid: int | None = None) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().split(".")[0] or "host"
    return Path.cwd() / DEFAULT_PARENT / f"{stamp}-{host}-{pid or os.getpid()}"


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def create(path: str | os.PathLike[str] | None) -> Path:
    out = Path(path) if path else default_path()
    make_private_dir(out)
    make_private_dir(out / TABLES_DIR)
    return out.resolve()


def make_private_dir(path: Path) -> None:
    """mkdir -p where every directory created is 0700; existing ones are left as they are
    (`--run-dir .` must not change the mode of the user's own directory)."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(directory, PRIVATE_DIR)  # mkdir's mode is filtered by the umask


def open_private(path: Path, append: bool = False) -> int:
    """A file descriptor for writing `path`, created 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # an existing file keeps its mode through O_CREAT
    except OSError:
        os.close(fd)
        raise
    return fd


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / META_FILE).exists() or (p / TABLES_DIR).is_dir())


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    tmp = run_dir / f".{META_FILE}.{os.getpid()}.tmp"
    with os.fdopen(open_private(tmp), "w", encoding="utf-8") as f:
        f.write(json.dumps(meta, indent=2, sort_keys=True, default=str))
    os.replace(tmp, run_dir / META_FILE)


def read_meta(run_dir: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run_dir / META_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def write_token(run_dir: Path, token: str) -> Path:
    path = run_dir / TOKEN_FILE
    fd = open_private(path)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return path
