"""A bounded, append-only table: the training thread appends row tuples, background threads seal
them into columnar blocks.

`append` is one list append: no lock, no numpy, nothing that can wait. Sealing (turning pending
rows into numpy blocks) runs on the spill thread or on a query; it holds a lock that only those
background threads take. The oldest rows are dropped once the table holds `capacity` rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from torchdoctor.store.columns import Block
from torchdoctor.store.schema import TableSpec

# Sealed blocks smaller than this are merged, so a long run does not leave thousands of
# one-row blocks behind it.
MERGE_ROWS = 16_384
# Rows sealed but not spilled yet are kept up to the table's capacity, and never fewer than
# this: a spill thread that lags a few seconds behind a fast loop (a busy machine) must lose
# none of them, even where TORCHDOCTOR_MAX_ROWS made the table small; one that died (a full
# disk) still leaves the process a bounded amount.
UNSPILLED_FLOOR = 65_536


class RingTable:
    def __init__(self, spec: TableSpec, capacity: int | None = None) -> None:
        self.spec = spec
        self.capacity = capacity or spec.capacity
        self._pending: list[tuple[Any, ...]] = []  # never replaced: sealing deletes a prefix
        # The training thread's appends are the list's own methods: no Python frame per row.
        self.append: Callable[[tuple[Any, ...]], None] = self._pending.append
        self.extend: Callable[[Iterable[tuple[Any, ...]]], None] = self._pending.extend
        self._blocks: list[Block] = []
        self._rows = 0
        self._dropped = 0
        self._unspilled: list[Block] = []
        self._unspilled_rows = 0
        self._unspilled_cap = max(self.capacity, UNSPILLED_FLOOR)
        self._lock = threading.Lock()
        self._cache: Block | None = None

    # -- background threads ----------------------------------------------------------------
    def seal(self) -> None:
        with self._lock:
            self._seal_locked()

    def _seal_locked(self) -> None:
        n = len(self._pending)
        if not n:
            return
        rows = self._pending[:n]
        # Appends made meanwhile land after index n: deleting the first n rows keeps them.
        del self._pending[:n]
        block = Block.from_rows(self.spec, rows)
        self._unspilled.append(block)
        self._unspilled_rows += block.rows
        # Nobody spilling (the disk failed, or no spill thread): keep a bounded amount.
        while self._unspilled_rows - self._unspilled[0].rows >= self._unspilled_cap:
            self._unspilled_rows -= self._unspilled.pop(0).rows
        self._blocks.append(block)
        self._rows += block.rows
        while (
            len(self._blocks) >= 2 and self._blocks[-1].rows + self._blocks[-2].rows <= MERGE_ROWS
        ):
            last = self._blocks.pop()
            self._blocks[-1] = Block.concat(self.spec, [self._blocks[-1], last])
        while self._rows > self.capacity:
            excess = self._rows - self.capacity
            first = self._blocks[0]
            if first.rows <= excess:
                self._blocks.pop(0)
                self._rows -= first.rows
                self._dropped += first.rows
            else:
                self._blocks[0] = first.tail(excess)
                self._rows -= excess
                self._dropped += excess
        self._cache = None

    def snapshot(self) -> Block:
        """Every row held, oldest first, as one block (cached until the next append is sealed)."""
        with self._lock:
            self._seal_locked()
            if self._cache is None:
                self._cache = Block.concat(self.spec, self._blocks)
                self._blocks = [self._cache] if self._cache.rows else []
            return self._cache

    def blocks(self) -> list[Block]:
        """Every row held, oldest first, in the sealed blocks as they are: no copy, for readers
        that aggregate (a /metrics scrape must not copy a million rows)."""
        with self._lock:
            self._seal_locked()
            return list(self._blocks)

    def take_unspilled(self) -> list[Block]:
        with self._lock:
            self._seal_locked()
            out, self._unspilled = self._unspilled, []
            self._unspilled_rows = 0
            return out

    @property
    def dropped(self) -> int:
        """Rows dropped from memory because the table was full (they are still on disk)."""
        return self._dropped

    def __len__(self) -> int:
        return self._rows + len(self._pending)
