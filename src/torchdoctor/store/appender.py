"""Append-only files that keep every record through any end of the process, at the cost of a
memory store rather than a system call.

`open_appender(path)` gives a `MappedAppender` where the platform allows: the file is grown a
chunk at a time, its blocks reserved (posix_fallocate), and its last chunk mapped shared (only
that one: resident memory does not grow with the file); a record is copied into the map. The
pages belong to the kernel's page cache from that moment, so a SIGABRT or a `kill -9` the next
instant loses nothing, and readers in other processes see the record at once.
Why not os.write: on the hot path (a collective call) a system call lets the GIL go, and the
training thread may wait for one of our own threads to give it back (measured inside a DDP job:
45 us per write, against under 1 us for the store).

The cost of the map: until `close()` trims it, the file ends in NUL padding (up to a chunk),
which readers skip (`records`). Reserving the blocks first is what keeps a full disk from
turning into a SIGBUS inside the training: the reservation fails with an OSError instead. Where
there is no shared map or reservation (Windows, macOS, a filesystem that refuses),
`open_appender` falls back to `PlainAppender`: one O_APPEND write per record, as safe and
slower.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

from torchdoctor.store.rundir import open_private

CHUNK = 1 << 20  # a collective's record is ~200 bytes: one growth per ~5000 calls


class PlainAppender:
    """One O_APPEND write per record (the fallback)."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = open_private(path, append=True)

    def write(self, data: bytes) -> None:
        if self._fd is not None:
            os.write(self._fd, data)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class MappedAppender:
    """Records copied into a shared map of the file's last chunk (see the module's docstring).
    Only that chunk is mapped, so the process's resident memory does not grow with the file.
    Any thread; `write` raises OSError when the file cannot grow (a full disk)."""

    def __init__(self, path: Path) -> None:
        fd = open_private(path, update=True)
        try:
            self._fd: int | None = fd
            self._end = _content_end(fd, os.fstat(fd).st_size)  # a run ended untrimmed
            self._base = self._end - self._end % CHUNK  # file offset of the mapped chunk
            self._map = self._window(self._base)  # fails here, not mid-training
        except BaseException:
            os.close(fd)
            raise
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._fd is None:  # closed: a late record is dropped, as PlainAppender does
                return
            at = self._end - self._base
            end = at + len(data)
            if end <= CHUNK:  # nearly always: a record is ~200 bytes, a chunk a megabyte
                self._map[at:end] = data
            else:
                self._spill_over(data, at)
            self._end += len(data)

    def _spill_over(self, data: bytes, at: int) -> None:
        """Fill this chunk, then go on in the next ones (reserved and mapped in turn)."""
        view = memoryview(data)
        while len(view):
            room = CHUNK - at
            if room <= 0:
                new = self._window(self._base + CHUNK)  # raises before anything moves
                old, self._map = self._map, new
                self._base += CHUNK
                old.close()
                at, room = 0, CHUNK
            part = view[:room]
            self._map[at : at + len(part)] = part
            view, at = view[len(part) :], at + len(part)

    def _window(self, base: int) -> mmap.mmap:
        """The chunk at `base`, its blocks reserved first: a store into it can never meet a
        full disk (which would be a SIGBUS), the reservation fails with an OSError instead."""
        if self._fd is None:
            raise OSError("the appender is closed")
        os.posix_fallocate(self._fd, base, CHUNK)
        return mmap.mmap(
            self._fd, CHUNK, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=base
        )

    def close(self) -> None:
        """Unmap and cut the padding: the file is its records again."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            self._map.close()
            try:
                os.ftruncate(fd, self._end)
            finally:
                os.close(fd)


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
