"""Append-only files that keep every record through any end of the process, at the cost of a
memory store rather than a system call.

`open_appender(path)` gives a `MappedAppender` where the platform allows: the file is grown a
chunk at a time, its blocks reserved (posix_fallocate), and mapped shared; a record is copied
into the map. The pages belong to the kernel's page cache from that moment, so a SIGABRT or a
`kill -9` the next instant loses nothing, and readers in other processes see the record at once.
Why not os.write: on the hot path (a collective call) a system call lets the GIL go, and the
training thread may wait for one of our own threads to give it back (measured inside a DDP job:
45 us per write, against under 1 us for the store).

The cost of the map: until `close()` trims it, the file ends in NUL padding (up to a chunk),
which readers skip (`records`). Reserving the blocks first is what keeps a full disk from
turning into a SIGBUS inside the training: the reservation fails with an OSError instead. Where
there is no shared map or reservation (Windows, macOS, a filesystem that refuses), `open_appender`
falls back to `PlainAppender`: one O_APPEND write per record, as safe and slower.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

CHUNK = 1 << 20  # a collective's record is ~200 bytes: one growth per ~5000 calls
_FLAGS = getattr(os, "O_CLOEXEC", 0)
_MODE = 0o600  # run directories hold the training's data: see store/rundir.py


class PlainAppender:
    """One O_APPEND write per record (the fallback)."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _FLAGS, _MODE)

    def write(self, data: bytes) -> None:
        if self._fd is not None:
            os.write(self._fd, data)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class MappedAppender:
    """Records copied into a shared map of the file (see the module's docstring). Any thread;
    `write` raises OSError when the file cannot grow (a full disk)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, _MODE)
        try:
            self._size = os.fstat(fd).st_size
            self._end = _content_end(fd, self._size)  # a run that ended without trimming
            self._map: mmap.mmap | None = None
            self._fd: int | None = fd
            self._grow(self._end + 1)  # fails here, not mid-training, where the map cannot be had
        except BaseException:
            os.close(fd)
            raise
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            start = self._end
            end = start + len(data)
            mapped = self._map
            if end > self._size or mapped is None:
                mapped = self._grow(end)
            mapped[start:end] = data
            self._end = end

    def close(self) -> None:
        """Unmap and cut the padding: the file is its records again."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            if self._map is not None:
                self._map.close()
                self._map = None
            try:
                os.ftruncate(fd, self._end)
            finally:
                os.close(fd)

    def _grow(self, need: int) -> mmap.mmap:
        if self._fd is None:
            raise OSError("the appender is closed")
        size = max(self._size, (need // CHUNK + 1) * CHUNK)
        # every block reserved, so that no store can meet a full disk (a SIGBUS); the part
        # mapped before is reserved already, the whole file the first time (it may be sparse)
        start = self._size if self._map is not None else 0
        os.posix_fallocate(self._fd, start, size - start)
        new = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        old, self._map, self._size = self._map, new, size
        if old is not None:
            old.close()
        return new


def open_appender(path: Path) -> MappedAppender | PlainAppender:
    if hasattr(os, "posix_fallocate") and hasattr(mmap, "MAP_SHARED"):
        try:
            return MappedAppender(path)
        except (OSError, ValueError):  # a filesystem without shared maps or reservation
            pass
    return PlainAppender(path)


def records(data: bytes) -> bytes:
    """The records of an appended file's bytes, without the NUL padding a mapped file carries
    until it is closed (a process killed while writing leaves it)."""
    return data.rstrip(b"\0")


def _content_end(fd: int, size: int) -> int:
    """Where the records of an existing file end: before its trailing NULs."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        block = os.pread(fd, end - start, start).rstrip(b"\0")
        if block:
            return start + len(block)
        end = start
    return 0
