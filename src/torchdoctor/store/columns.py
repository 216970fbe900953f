"""Columnar blocks of rows: numpy arrays per column, with null masks where a column allows NULL."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchdoctor.store.schema import BOOL, FLOAT, INT, STR, TableSpec

DTYPES = {INT: np.dtype("<i8"), FLOAT: np.dtype("<f8"), BOOL: np.dtype("?"), STR: np.dtype("O")}
_FILL = {INT: 0, FLOAT: 0.0, BOOL: False, STR: None}


@dataclasses.dataclass
class Block:
    """Rows of one table in columns. `nulls[name]` is True where the value is NULL."""

    spec: TableSpec
    data: dict[str, np.ndarray]
    nulls: dict[str, np.ndarray]
    rows: int

    @classmethod
    def from_rows(cls, spec: TableSpec, rows: Sequence[Sequence[Any]]) -> Block:
        data: dict[str, np.ndarray] = {}
        nulls: dict[str, np.ndarray] = {}
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(spec.columns)
        for col, values in zip(spec.columns, columns, strict=True):
            missing = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
            if missing.any():
                # NULL where a value is missing, whatever the column promised: a frame with
                # no line number must not fail the whole query.
                fill = _FILL[col.type]
                values = tuple(fill if v is None else v for v in values)
                nulls[col.name] = missing
            elif col.nullable:
                nulls[col.name] = missing
            data[col.name] = _array(values, col.type)
        return cls(spec, data, nulls, len(rows))

    @classmethod
    def empty(cls, spec: TableSpec) -> Block:
        return cls.from_rows(spec, [])

    @classmethod
    def concat(cls, spec: TableSpec, blocks: Sequence[Block]) -> Block:
        blocks = [b for b in blocks if b.rows]
        if not blocks:
            return cls.empty(spec)
        if len(blocks) == 1:
            return blocks[0]
        data = {c: np.concatenate([b.data[c] for b in blocks]) for c in spec.column_names}
        nulls = {}
        for col in spec.columns:
            if col.nullable or any(col.name in b.nulls for b in blocks):
                nulls[col.name] = np.concatenate([b.null_mask(col.name) for b in blocks])
        return cls(spec, data, nulls, sum(b.rows for b in blocks))

    def null_mask(self, name: str) -> np.ndarray:
        mask = self.nulls.get(name)
        return np.zeros(self.rows, dtype=bool) if mask is None else mask

    def tail(self, start: int) -> Block:
        """The rows from `start` on."""
        return self.rows_between(start, self.rows)

    def rows_between(self, start: int, stop: int) -> Block:
        """The rows from `start` up to, not including, `stop`."""
        start, stop = max(0, start), min(self.rows, stop)
        return Block(
            self.spec,
            {k: v[start:stop] for k, v in self.data.items()},
            {k: v[start:stop] for k, v in self.nulls.items()},
            max(0, stop - start),
        )

    def column(self, name: str) -> list[Any]:
        """One column as Python values, None where NULL."""
        values = self.data[name].tolist()
        mask = self.nulls.get(name)
        if mask is not None and mask.any():
            values = [None if m else v for v, m in zip(values, mask.tolist(), strict=True)]
        return values

    def to_records(self) -> list[dict[str, Any]]:
        cols = {name: self.column(name) for name in self.spec.column_names}
        return [{name: cols[name][i] for name in cols} for i in range(self.rows)]


def _array(values: Sequence[Any], type_: str) -> np.ndarray:
    if type_ == STR:
        out = np.empty(len(values), dtype=object)
        out[:] = [v if v is None or isinstance(v, str) else str(v) for v in values]
        return out
    return np.asarray(values, dtype=DTYPES[type_]).reshape(len(values))
