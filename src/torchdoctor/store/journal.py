"""Write-through tables: each record reaches the run directory as it happens (store/appender.py:
a store into the file's shared map, or one os.write where there is none).

python.collectives is one. The record of a collective must be on disk before the call that may
end the process: gloo and NCCL abort a rank with SIGABRT, after which no Python code runs, so
the spill thread's next second never comes. The table file is `tables/<name>.log`, one line per
event, each appended whole before the call that made it goes on, so it survives any end of the
process:

    I [id, value, value, ...]     issued: the row's values in column order
    E [id, duration, state]       ended: completed or failed, with its duration

An issued row is written at once; ends wait for the next issued row (one write per call) or
the spill thread's next second, whichever comes first. Before it writes them, the spill thread
runs the table's `settle` (collectives: end the calls whose work has completed), so what the
file says is at most a second old whatever the training thread does.

A line cut short by a kill is skipped by the reader, and so is the NUL padding of a mapped file
that was not closed; an `I` without its `E` is a call still in
flight when the process ended (state `issued`): for a rank that died in a collective, the last
one. JSON keeps it readable by anything, and nothing in it is ever evaluated.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchdoctor.store import rundir
from torchdoctor.store.appender import MappedAppender, PlainAppender, open_appender, records
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import TableSpec
from torchdoctor.store.table import RingTable

SUFFIX = ".log"
ISSUED, ENDED = b"I ", b"E "


def path_of(directory: Path, spec: TableSpec) -> Path:
    return directory / rundir.TABLES_DIR / f"{spec.name}{SUFFIX}"


class JournalTable(RingTable):
    """A table whose rows are open (issued) until they end. Live queries see the ended rows
    and the open ones; the journal file is the saved form (the spill thread writes nothing)."""

    def __init__(self, spec: TableSpec, capacity: int | None = None) -> None:
        super().__init__(spec, capacity)
        self._ids = itertools.count()
        self._open: dict[int, tuple[Any, ...]] = {}
        self._state = spec.index("state")
        self._duration = spec.index("duration")
        self._directory: Callable[[], Path] | None = None
        self._file: MappedAppender | PlainAppender | None = None
        self._file_lock = threading.Lock()  # only the first open takes it
        # E lines not yet written: a deque, so that ends added on one thread while another
        # writes them are never lost (append and popleft are atomic)
        self._ends: collections.deque[bytes] = collections.deque()
        self.write_errors = 0
        self.settle: Callable[[], None] | None = None  # run before the spill writes the ends

    def attach(self, directory: Callable[[], Path]) -> None:
        """Where the journal goes (the run directory, read when the first record comes)."""
        self._directory = directory

    # -- any thread (the training thread, a backend's completion thread) -------------------
    def issue(self, row: tuple[Any, ...], encoded: str | None = None) -> int:
        """Record an issued row, on disk before this returns; its id, for `end`. `encoded`:
        the row's values as the body of a JSON array ("1,\"default\",..."), when the caller
        has a faster way to write them than the general encoder (collectives: every call)."""
        rid = next(self._ids)
        self._open[rid] = row
        line = _line([rid, *row]) if encoded is None else f"I [{rid},{encoded}]\n".encode()
        self._write(self._take_ends() + line if self._ends else line)
        return rid

    def end(self, rid: int, duration: float | None, state: str) -> None:
        row = self._open.pop(rid, None)
        if row is None:
            return
        self._ends.append(_end_line(rid, duration, state))
        values = list(row)
        values[self._duration], values[self._state] = duration, state
        self.append(tuple(values))

    def open_rows(self) -> list[tuple[Any, ...]]:
        return list(self._open.values())

    def _write(self, data: bytes) -> None:
        file = self._file if self._file is not None else self._open_file()
        if file is None:
            return
        try:
            file.write(data)
        except OSError:
            self.write_errors += 1

    def _open_file(self) -> MappedAppender | PlainAppender | None:
        with self._file_lock:
            if self._file is None and self._directory is not None:
                path = path_of(self._directory(), self.spec)
                try:
                    rundir.make_private_dir(path.parent)
                    self._file = open_appender(path)
                except OSError:
                    self.write_errors += 1
                    self._directory = None  # do not try again on every record
            return self._file

    def close(self) -> None:
        """The run is over: later records (a completion arriving late) are not written."""
        self.write_ends()
        with self._file_lock:
            file, self._file, self._directory = self._file, None, None
        if file is not None:
            try:
                file.close()
            except OSError:
                self.write_errors += 1

    # -- readers -----------------------------------------------------------------------------
    def snapshot(self) -> Block:
        ended = super().snapshot()
        pending = self.open_rows()
        if not pending:
            return ended
        return Block.concat(self.spec, [ended, Block.from_rows(self.spec, pending)])

    def blocks(self) -> list[Block]:
        pending = self.open_rows()
        extra = [Block.from_rows(self.spec, pending)] if pending else []
        return super().blocks() + extra

    def write_ends(self) -> None:
        if self._ends:
            self._write(self._take_ends())

    def _take_ends(self) -> bytes:
        ends, out = self._ends, []
        try:
            while True:
                out.append(ends.popleft())
        except IndexError:
            return b"".join(out)

    def take_unspilled(self) -> list[Block]:
        super().take_unspilled()  # on disk line by line, but for the latest ends
        if self.settle is not None:
            self.settle()
        self.write_ends()
        return []

    def __len__(self) -> int:
        return super().__len__() + len(self._open)


_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode  # one, not one per row


def _line(values: Sequence[Any]) -> bytes:
    return ISSUED + _encode(values).encode() + b"\n"


def _end_line(rid: int, duration: float | None, state: str) -> bytes:
    took = "null" if duration is None else repr(float(duration))
    return f'E [{rid},{took},"{state}"]\n'.encode()


def read(path: Path, spec: TableSpec) -> tuple[Block, bool]:
    """The rows of a saved journal (open ones with state `issued`), and whether a line was
    cut short."""
    rows: dict[int, list[Any]] = {}
    truncated = False
    width = len(spec.columns)
    state, duration = spec.index("state"), spec.index("duration")
    for raw in records(path.read_bytes()).splitlines():
        try:
            values = json.loads(raw[2:])
            if raw.startswith(ISSUED) and len(values) == width + 1:
                rows[int(values[0])] = list(values[1:])
            elif raw.startswith(ENDED) and int(values[0]) in rows:
                row = rows[int(values[0])]
                row[duration], row[state] = values[1], values[2]
            else:
                truncated = True
        except (ValueError, TypeError, IndexError):
            truncated = True
    return Block.from_rows(spec, [tuple(r) for r in rows.values()]), truncated
