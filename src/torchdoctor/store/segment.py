"""The saved table format: one append-only file per table, a sequence of columnar batches.

    file   := MAGIC batch*
    batch  := b"B" u32(len(header)) header payload*
    header := JSON {"rows": n, "columns": [{"name", "type", "nbytes", "null_nbytes"}]}

Numbers are raw little-endian arrays, strings a JSON list, null masks raw booleans. Nothing is
pickled, so reading a run directory someone else wrote cannot run code. A batch cut short by a
`kill -9` is ignored by the reader; everything before it is kept.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from torchdoctor.store.columns import DTYPES, Block
from torchdoctor.store.rundir import open_private
from torchdoctor.store.schema import STR, TableSpec

MAGIC = b"TDSEG1\n"
_LEN = struct.Struct("<I")


def encode(block: Block) -> bytes:
    payloads: list[bytes] = []
    columns = []
    for col in block.spec.columns:
        values = block.data[col.name]
        if col.type == STR:
            raw = json.dumps(values.tolist(), ensure_ascii=False).encode()
        else:
            raw = np.ascontiguousarray(values, dtype=DTYPES[col.type]).tobytes()
        null_raw = b""
        if col.name in block.nulls:
            null_raw = np.ascontiguousarray(block.nulls[col.name], dtype=bool).tobytes()
        payloads += [raw, null_raw]
        columns.append(
            {"name": col.name, "type": col.type, "nbytes": len(raw), "null_nbytes": len(null_raw)}
        )
    header = json.dumps({"rows": block.rows, "columns": columns}).encode()
    return b"B" + _LEN.pack(len(header)) + header + b"".join(payloads)


class SegmentWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        self._file: BinaryIO = os.fdopen(open_private(path, append=True), "ab")
        if fresh:
            self._file.write(MAGIC)

    def write(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.rows:
                self._file.write(encode(block))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read(path: Path, spec: TableSpec) -> tuple[Block, bool]:
    """All complete batches of a saved table, and whether a cut-short tail was ignored."""
    raw = path.read_bytes()
    if len(raw) < len(MAGIC) and MAGIC.startswith(raw):
        # Created by the writer a moment ago, its first flush not yet done: no rows yet.
        return Block.empty(spec), False
    if not raw.startswith(MAGIC):
        raise ValueError(f"{path} is not a torchdoctor table file")
    pos = len(MAGIC)
    blocks: list[Block] = []
    truncated = False
    while pos < len(raw):
        try:
            block, pos = _decode(raw, pos, spec)
        except (ValueError, KeyError, struct.error, json.JSONDecodeError):
            truncated = True
            break
        blocks.append(block)
    return Block.concat(spec, blocks), truncated


def _decode(raw: bytes, pos: int, spec: TableSpec) -> tuple[Block, int]:
    if raw[pos : pos + 1] != b"B":
        raise ValueError("bad batch marker")
    (hlen,) = _LEN.unpack_from(raw, pos + 1)
    pos += 1 + _LEN.size
    header = json.loads(raw[pos : pos + hlen])
    pos += hlen
    rows = int(header["rows"])
    saved = {}
    for col in header["columns"]:
        end = pos + col["nbytes"]
        null_end = end + col["null_nbytes"]
        if null_end > len(raw):
            raise ValueError("batch cut short")
        saved[col["name"]] = (col["type"], raw[pos:end], raw[end:null_end])
        pos = null_end
    data: dict[str, np.ndarray] = {}
    nulls: dict[str, np.ndarray] = {}
    for col in spec.columns:
        if col.name not in saved:  # a column added after the run was saved
            data[col.name] = np.zeros(rows, dtype=DTYPES[col.type])
            nulls[col.name] = np.ones(rows, dtype=bool)
            continue
        _type, payload, null_payload = saved[col.name]
        if col.type == STR:
            values = json.loads(payload)
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
        else:
            arr = np.frombuffer(payload, dtype=DTYPES[col.type]).copy()
        if len(arr) != rows:
            raise ValueError("column length does not match its batch")
        data[col.name] = arr
        if null_payload:
            nulls[col.name] = np.frombuffer(null_payload, dtype=bool).copy()
    return Block(spec, data, nulls, rows), pos
