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

Where the C++ kernel records collectives (torchdoctor/native), it writes this same file itself
(`follow`), ends included, and the table reads the file back for live queries (`catch_up`, on
the spill thread's second and before a live query).

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
        # following a journal another writer appends to: its path, how far it was read, the
        # start of a line not yet whole, and how to close that writer at the run's end
        self._followed: Path | None = None
        self._read_to = 0
        self._partial = b""
        self._close_writer: Callable[[], None] | None = None
        self._catching_up = threading.Lock()

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
        if self.spec.ends_in_order and state == COMPLETED:
            for earlier in _ended_before(self.spec, self._open, row):
                self.end(earlier, None, COMPLETED)

    def open_rows(self) -> list[tuple[Any, ...]]:
        return list(self._open.values())

    # -- another writer (the C++ kernel) -------------------------------------------------------
    def follow(self, close_writer: Callable[[], None]) -> Path | None:
        """The journal's path, for a writer outside this table; from now on the table reads
        its rows from the file. `close_writer` is called at the run's end, before the last read.
        None where the run has no directory."""
        if self._directory is None:
            return None
        path = path_of(self._directory(), self.spec)
        rundir.make_private_dir(path.parent)
        self._followed, self._read_to, self._partial = path, 0, b""
        self._close_writer = close_writer
        return path

    def catch_up(self) -> None:
        """Read the lines the other writer appended since the last read."""
        path = self._followed
        if path is None:
            return
        with self._catching_up:
            try:
                with open(path, "rb") as f:
                    f.seek(self._read_to)
                    data = f.read()
            except OSError:
                return
            self._read_to += len(data)
            data = self._partial + data
            whole = data.rfind(b"\n") + 1
            self._partial = data[whole:]
            width = len(self.spec.columns)
            for raw in data[:whole].splitlines():
                parsed = _parse(raw, width)
                if parsed is None:
                    continue
                kind, values = parsed
                if kind == ISSUED:
                    self._open[int(values[0])] = tuple(values[1:])
                else:
                    row = self._open.pop(int(values[0]), None)
                    if row is not None:
                        ended = list(row)
                        ended[self._duration], ended[self._state] = values[1], values[2]
                        self.append(tuple(ended))
                        if self.spec.ends_in_order and values[2] == COMPLETED:
                            for earlier in _ended_before(self.spec, self._open, row):
                                done = list(self._open.pop(earlier))
                                done[self._duration], done[self._state] = None, COMPLETED
                                self.append(tuple(done))

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
        if self._close_writer is not None:
            self._close_writer()
            self._close_writer = None
            self.catch_up()
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
        self.catch_up()
        ended = super().snapshot()
        pending = self.open_rows()
        if not pending:
            return ended
        return Block.concat(self.spec, [ended, Block.from_rows(self.spec, pending)])

    def blocks(self) -> list[Block]:
        self.catch_up()
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
        self.catch_up()
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
        kind, values = _parse(raw, width) or (None, [])
        if kind == ISSUED:
            rows[values[0]] = values[1:]
        elif kind == ENDED and values[0] in rows:
            rows[values[0]][duration], rows[values[0]][state] = values[1], values[2]
        else:
            truncated = True
    if spec.ends_in_order:
        still_open = {rid: row for rid, row in rows.items() if row[state] == ISSUED_STATE}
        for row in list(rows.values()):
            if row[state] == COMPLETED:
                for earlier in _ended_before(spec, still_open, row):
                    rows[earlier][state] = COMPLETED
                    del still_open[earlier]
    return Block.from_rows(spec, [tuple(r) for r in rows.values()]), truncated


ISSUED_STATE, COMPLETED = "issued", "completed"


def _ended_before(spec: TableSpec, open_rows: dict[int, Any], row: Sequence[Any]) -> list[int]:
    """The open rows that `row`'s completion ends (TableSpec.ends_in_order): those of its group
    with a lower `seq`, point-to-point calls (numbered per peer) left out."""
    group, seq, peer = spec.index("group"), spec.index("seq"), spec.index("peer")
    if row[peer] is not None:
        return []
    return [
        rid
        for rid, other in list(open_rows.items())
        if other[group] == row[group] and other[peer] is None and other[seq] < row[seq]
    ]


def _parse(raw: bytes, width: int) -> tuple[bytes, list[Any]] | None:
    """(ISSUED or ENDED, the line's values) of a journal line; None for one cut short."""
    try:
        values = json.loads(raw[2:])
    except ValueError:
        return None
    if not isinstance(values, list) or not values or not isinstance(values[0], int):
        return None
    if raw.startswith(ISSUED) and len(values) == width + 1:
        return ISSUED, values
    if raw.startswith(ENDED) and len(values) == 3:
        return ENDED, values
    return None
