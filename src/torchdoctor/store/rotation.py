"""A table's files in the run directory, kept within the table's capacity.

    tables/<name>.seg                the active file: batches appended every second
    tables/<name>.<n>.seg            a closed file: rotated out of the active one, one batch
    tables/<name>.<a>-<b>.seg        closed files a..b merged into one (one batch)

The active file is rotated (renamed to the next number) once it holds `chunk_rows` rows or
`MAX_BATCHES` batches; a closed file is compacted into a single batch, merged with the previous
closed file while the two fit in `chunk_rows`, and the oldest closed files are deleted while the
newer ones still hold `capacity` rows. So a table keeps at least its newest `capacity` rows on
disk and at most `capacity + 2 * chunk_rows`, in a handful of files, however long the run.

Every step is crash-safe: a merged file is written under a temporary name and renamed, and a
reader ignores any file whose numbers lie inside another file's range, so a kill between the
rename and the deletion of the merged files never shows a row twice.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import TableSpec
from torchdoctor.store.segment import MAGIC, SegmentWriter, encode, read

MAX_BATCHES = 256  # batches in the active file before it is rotated (one per second at most)
MAX_CHUNK_ROWS = 65_536  # rows of one closed file: bounds the memory a merge needs
_CLOSED = re.compile(r"^(?P<name>[A-Za-z0-9_]+)\.(?P<first>\d+)(?:-(?P<last>\d+))?\.seg$")


def chunk_rows_for(capacity: int) -> int:
    return max(1, min(MAX_CHUNK_ROWS, capacity // 4))


@dataclasses.dataclass
class Chunk:
    first: int
    last: int
    rows: int
    path: Path


def active_path(directory: Path, name: str) -> Path:
    return directory / f"{name}{rundir.TABLE_SUFFIX}"


def closed_files(directory: Path, name: str) -> list[tuple[int, int, Path]]:
    """(first, last, path) of a table's closed files, oldest first, without those a merged
    file covers."""
    found = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        m = _CLOSED.match(entry.name)
        if m and m.group("name") == name:
            first = int(m.group("first"))
            last = int(m.group("last") or first)
            found.append((first, last, Path(entry.path)))
    found.sort(key=lambda f: (f[0], -f[1]))
    out: list[tuple[int, int, Path]] = []
    reach = -1
    for first, last, path in found:
        if last <= reach:
            continue  # inside a merged file whose parts were not deleted yet
        out.append((first, last, path))
        reach = last
    return out


def read_table(directory: Path, spec: TableSpec) -> tuple[Block, bool]:
    """Every row of a table on disk, oldest first, and whether a cut-short batch was skipped."""
    for _attempt in range(3):
        paths = [p for _f, _l, p in closed_files(directory, spec.name)]
        paths.append(active_path(directory, spec.name))
        blocks: list[Block] = []
        truncated = False
        try:
            for i, path in enumerate(paths):
                if i == len(paths) - 1 and not path.exists():
                    continue  # rotated a moment ago, or nothing written yet
                block, cut = read(path, spec)
                blocks.append(block)
                truncated = truncated or cut
        except FileNotFoundError:
            continue  # merged or deleted while we listed: list again
        return Block.concat(spec, blocks), truncated
    raise OSError(f"the files of table {spec.name} in {directory} keep changing")


class TableFiles:
    """The writer of one table's files (used by the spill thread only)."""

    def __init__(self, directory: Path, spec: TableSpec, capacity: int) -> None:
        self.directory = directory
        self.spec = spec
        self.capacity = capacity
        self.chunk_rows = chunk_rows_for(capacity)
        # Files of an earlier process in the same run directory are left alone; numbering
        # goes on after them.
        known = closed_files(directory, spec.name)
        self._next = (max(last for _f, last, _p in known) + 1) if known else 1
        self._closed: list[Chunk] = []
        self._path = active_path(directory, spec.name)
        self._writer: SegmentWriter | None = None
        self._rows = 0
        self._batches = 0

    def write(self, blocks: list[Block]) -> None:
        """Append the blocks, rotating whenever the active file holds `chunk_rows` rows: a
        second's rows of a fast loop can be more than a chunk (up to the table's capacity), and
        a closed file must not be, or the bound on the directory's size would not hold."""
        for block in blocks:
            done = 0
            while done < block.rows:
                take = min(block.rows - done, self.chunk_rows - self._rows)
                if self._writer is None:
                    self._writer = SegmentWriter(self._path)
                whole = take == block.rows  # the usual case: no copy
                self._writer.write([block if whole else block.rows_between(done, done + take)])
                done += take
                self._rows += take
                self._batches += 1
                if self._rows >= self.chunk_rows or self._batches >= MAX_BATCHES:
                    self.rotate()

    def rotate(self) -> None:
        if self._writer is None or not self._rows:
            return
        self._writer.close()
        self._writer = None
        n = self._next
        self._next += 1
        path = self.directory / f"{self.spec.name}.{n:06d}{rundir.TABLE_SUFFIX}"
        os.replace(self._path, path)
        chunk = Chunk(n, n, self._rows, path)
        batches, self._rows, self._batches = self._batches, 0, 0
        previous = self._closed[-1] if self._closed else None
        if previous is not None and previous.rows + chunk.rows <= self.chunk_rows:
            self._closed[-1] = self._merge(previous, chunk)
        else:
            if batches > 1:
                self._merge(chunk)
            self._closed.append(chunk)
        self._drop_oldest()

    def _merge(self, *chunks: Chunk) -> Chunk:
        """The chunks rewritten as one file of one batch; the old files removed."""
        blocks = [read(c.path, self.spec)[0] for c in chunks]
        first, last = chunks[0].first, chunks[-1].last
        name = f"{first:06d}" if first == last else f"{first:06d}-{last:06d}"
        path = self.directory / f"{self.spec.name}.{name}{rundir.TABLE_SUFFIX}"
        tmp = self.directory / f".{self.spec.name}.{name}.tmp"
        merged = Block.concat(self.spec, blocks)
        with os.fdopen(rundir.open_private(tmp), "wb") as f:
            f.write(MAGIC + encode(merged))
        os.replace(tmp, path)
        for c in chunks:
            if c.path != path:
                c.path.unlink(missing_ok=True)
        return Chunk(first, last, merged.rows, path)

    def _drop_oldest(self) -> None:
        held = sum(c.rows for c in self._closed)
        while len(self._closed) > 1 and held - self._closed[0].rows >= self.capacity:
            oldest = self._closed.pop(0)
            held -= oldest.rows
            oldest.path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
