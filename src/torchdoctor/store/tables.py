"""The in-memory tables of one process, and the thread that spills them to the run directory."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.journal import JournalTable
from torchdoctor.store.rotation import TableFiles
from torchdoctor.store.schema import BY_NAME, DIAGNOSES, STORED, TableSpec
from torchdoctor.store.table import RingTable

log = logging.getLogger("torchdoctor")


class Tables:
    """The stored tables of a live process, by name."""

    def __init__(
        self, capacities: dict[str, int] | None = None, max_rows: int | None = None
    ) -> None:
        """`max_rows`: no table keeps more rows than this (in memory and on disk)."""
        caps = dict(capacities or {})
        if max_rows:
            caps = {s.name: min(caps.get(s.name, s.capacity), max_rows) for s in STORED}
        self._tables = {spec.name: _table(spec, caps.get(spec.name)) for spec in STORED}

    def __getitem__(self, name: str) -> RingTable:
        return self._tables[name]

    def journal(self, name: str) -> JournalTable:
        """A write-through table (store/journal.py: rows open until they end), as such."""
        table = self._tables[name]
        if not isinstance(table, JournalTable):
            raise KeyError(f"{name} is not a write-through table")
        return table

    def names(self) -> list[str]:
        return list(self._tables)

    def items(self) -> list[tuple[str, RingTable]]:
        return list(self._tables.items())


def _table(spec: TableSpec, capacity: int | None) -> RingTable:
    return JournalTable(spec, capacity) if spec.write_through else RingTable(spec, capacity)


class Spiller:
    """Writes what the tables gained since the last flush, every `interval` seconds.

    Diagnoses go to diagnoses.jsonl (one JSON object per line, readable by anything); every
    other table to tables/<name>.seg, rotated so that the disk keeps about the table's capacity
    (store/rotation.py); write-through tables (store/journal.py) write themselves. A `kill -9`
    loses at most the last interval.
    """

    def __init__(self, tables: Tables, directory: Path, interval: float = 1.0) -> None:
        self.tables = tables
        self.directory = directory
        self.interval = interval
        self._writers: dict[str, TableFiles] = {}
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-spill", daemon=True)
        rundir.make_private_dir(directory / rundir.TABLES_DIR)
        for _name, table in tables.items():
            if isinstance(table, JournalTable):  # writes itself, into wherever the run is now
                table.attach(lambda: self.directory)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception as exc:  # disk full, directory removed: keep training, say once
                log.warning("torchdoctor: cannot save tables to %s: %s", self.directory, exc)
                return

    def flush(self, only: str | None = None, timeout: float = -1) -> None:
        """timeout: give up after that long when another flush holds the files (a signal
        handler may have interrupted one on its own thread)."""
        if not self._flush_lock.acquire(timeout=timeout):
            return
        try:
            self._flush_locked(only)
        finally:
            self._flush_lock.release()

    def relocate(self, move: Callable[[Path], Path]) -> Path:
        """Save what is pending, close the table files, have `move(old)` move the record, and
        go on writing in the directory it returns."""
        with self._flush_lock:
            self._flush_locked(None)
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
            self.directory = move(self.directory)
            return self.directory

    def _flush_locked(self, only: str | None) -> None:
        for name, table in self.tables.items():
            if only is not None and name != only:
                continue
            blocks = table.take_unspilled()
            if not blocks:
                continue
            if name == DIAGNOSES.name:
                _append_jsonl(self.directory / rundir.DIAGNOSES_FILE, blocks)
                continue
            writer = self._writers.get(name)
            if writer is None:
                where = self.directory / rundir.TABLES_DIR
                writer = self._writers[name] = TableFiles(where, table.spec, table.capacity)
            writer.write(blocks)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.flush()
        finally:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
            for _name, table in self.tables.items():
                if isinstance(table, JournalTable):
                    table.close()


def _append_jsonl(path: Path, blocks: list[Block]) -> None:
    with os.fdopen(rundir.open_private(path, append=True), "a", encoding="utf-8") as f:
        for block in blocks:
            for record in block.to_records():
                f.write(json.dumps(diagnosis_to_json(record), allow_nan=False) + "\n")


def diagnosis_to_json(record: dict) -> dict:
    """A diagnoses row as saved: `evidence` becomes an object again, not a string."""
    out = dict(record)
    try:
        out["evidence"] = json.loads(record.get("evidence") or "{}")
    except ValueError:
        pass
    return out


def diagnosis_from_json(obj: dict) -> tuple:
    spec = BY_NAME["diagnoses"]
    values = dict(obj)
    if not isinstance(values.get("evidence"), str):
        values["evidence"] = json.dumps(values.get("evidence") or {}, allow_nan=False)
    return tuple(values.get(c) for c in spec.column_names)
