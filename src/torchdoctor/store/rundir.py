"""The run directory: one record format for live and finished runs.

<run_dir>/meta.json         who, what, when, how it ended (rewritten atomically)
<run_dir>/diagnoses.jsonl   one diagnosis per line, written as found
<run_dir>/tables/<t>.seg    every stored table, appended every second
<run_dir>/token             the TCP token, 0600, when --listen was given
<run_dir>/script.py         a copy of the script `__main__` ran (meta.json's `script` names it
                            and its hash), for `torchdoctor compare`'s diff of two runs
<run_dir>/fatal.log         the stacks of every thread when a fatal signal (SIGABRT, SIGSEGV)
                            ended the process (faulthandler; removed when empty)

A rank of a distributed job writes to JOB_DIR/rank<N>/ (see torchdoctor.identity); a process
that learns it is a rank only when `init_process_group` runs moves its record there (`move`).

A run directory holds the token, stack traces, source lines and values from the training: it is
created 0700 (its parent `torchdoctor-runs/` too, when torchdoctor creates it) and every file in
it 0600, so that other users of the machine can read none of it whatever their umask.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
DIAGNOSES_FILE = "diagnoses.jsonl"
TABLES_DIR = "tables"
TABLE_SUFFIX = ".seg"
TOKEN_FILE = "token"
FATAL_FILE = "fatal.log"
SCRIPT_FILE = "script.py"
DEFAULT_PARENT = "torchdoctor-runs"


def default_path(parent: Path | None = None) -> Path:
    """Where a new run goes by default: PARENT/<date>-<time>-<host>-<pid> (PARENT being
    ./torchdoctor-runs), with -2, -3, ... after it when a session of this process that began
    in the same second has it already (sessions one after another in one process)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().split(".")[0] or "host"
    parent = parent if parent is not None else Path.cwd() / DEFAULT_PARENT
    name = f"{stamp}-{host}-{os.getpid()}"
    path, n = parent / name, 2
    while path.exists():
        path, n = parent / f"{name}-{n}", n + 1
    return path


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


def open_private(path: Path, append: bool = False, update: bool = False) -> int:
    """A file descriptor for writing `path`, created 0600: the file emptied first; with
    `append`, written at its end; with `update`, open to read and write as it is (a file
    mapped into memory, store/appender.py)."""
    if update:
        flags = os.O_RDWR | os.O_CREAT
    else:
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
    """meta.json, with the ending that a process gone without writing it could not record."""
    try:
        meta = dict(json.loads((run_dir / META_FILE).read_text()))
    except (OSError, ValueError):
        return {}
    return settle(run_dir, meta)


# faulthandler's first line -> the signal it reports
_FATAL = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def settle(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """A record still `running` whose process is gone (same host): `crashed` with the signal
    when faulthandler left its stacks (SIGABRT from gloo/NCCL, a segfault), else `killed`
    (SIGKILL, the OOM killer: nothing runs after them). `inferred` says the reader decided."""
    if meta.get("status") != "running" or meta.get("host") != socket.gethostname():
        return meta
    if _alive(meta.get("pid"), meta.get("started")):
        return meta
    out = dict(meta, status="killed", inferred=True)
    try:
        text = (run_dir / FATAL_FILE).read_text(errors="replace")
    except OSError:
        text = ""
    if text:
        first = text.splitlines()[0] if text.strip() else ""
        name = next((sig for words, sig in _FATAL.items() if words in first), "fatal signal")
        out.update(status="crashed", signal=name, fatal_file=str(run_dir / FATAL_FILE))
    return out


def _alive(pid: Any, started: Any) -> bool:
    """Whether process `pid` runs and is the one that started at `started` (not a zombie,
    not a later process given the same pid)."""
    if not isinstance(pid, int) or pid <= 0:
        return True  # nothing to judge by
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return False  # dead, not yet reaped by its parent (torchrun's agent)
    try:
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        recorded = _dt.datetime.fromisoformat(str(started)).timestamp()
    except (OSError, ValueError, StopIteration, IndexError):
        return True
    return began <= recorded + 5  # the recorded start is after the process's own start


def write_token(run_dir: Path, token: str) -> Path:
    return write_private(run_dir / TOKEN_FILE, token)


def write_private(path: Path, text: str) -> Path:
    """`path` (created 0600) holding `text`."""
    with os.fdopen(open_private(path), "w", encoding="utf-8") as f:
        f.write(text)
    return path


def move(old: Path, new: Path, whole: bool) -> Path:
    """Move a run's record from `old` to `new` and return `new`, resolved.

    whole: `old` is this process's own directory (a default one): renamed as a whole, files
    held open keep working. Otherwise `old` may be shared (a --run-dir given to every rank):
    only the tables, diagnoses, token and script copy move, and meta.json stays for its last
    writer to replace. Whatever cannot move stays where it was; the run goes on in `new`.
    """
    make_private_dir(new.parent)
    if whole and not new.exists():
        try:
            os.rename(old, new)
            return new.resolve()
        except OSError:
            pass
    make_private_dir(new / TABLES_DIR)
    names = [Path(TABLES_DIR) / p.name for p in (old / TABLES_DIR).glob("*") if p.is_file()]
    for rel in [*names, Path(DIAGNOSES_FILE), Path(TOKEN_FILE), Path(SCRIPT_FILE)]:
        src, dst = old / rel, new / rel
        if src.exists() and not dst.exists():
            try:
                shutil.move(src, dst)
            except OSError:
                pass
    # A shared directory keeps its tables/ (another rank may still write there until it
    # moves too); its meta.json goes if this process wrote it last.
    ours = read_meta(old).get("pid") == os.getpid()
    leftovers = [old / META_FILE] if ours or whole else []
    leftovers += [old / TABLES_DIR, old] if whole else []
    for leftover in leftovers:
        try:
            leftover.unlink() if leftover.is_file() else leftover.rmdir()  # rmdir: only if empty
        except OSError:
            pass
    return new.resolve()
