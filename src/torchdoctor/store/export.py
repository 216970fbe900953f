"""Every saved table written out for other tools: Parquet (pyarrow, the `export` extra) or CSV.

Types follow the table's schema (int64, float64, bool, string); NULL stays NULL and NaN stays
NaN in Parquet. CSV has no NULL: it is an empty field (so NULL and '' look alike in a text
column); non-finite floats are written nan, inf and -inf, which pandas and polars read back as
floats; booleans true and false.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Protocol

from torchdoctor._json import float_text
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import BOOL, FLOAT, INT, STR


class Tables(Protocol):
    def table_names(self) -> list[str]: ...

    def block(self, name: str) -> Block: ...


class ExportError(Exception):
    pass


def write_parquet(tables: Tables, directory: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError(
            "Parquet needs pyarrow: pip install 'torchdoctor[export]' (or use --csv)"
        ) from None
    types = {INT: pa.int64(), FLOAT: pa.float64(), BOOL: pa.bool_(), STR: pa.string()}
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in tables.table_names():
        block = tables.block(name)
        arrays, fields = [], []
        for col in block.spec.columns:
            mask = block.nulls.get(col.name)
            values = block.data[col.name]
            arrays.append(pa.array(values, type=types[col.type], mask=mask))
            fields.append(pa.field(col.name, types[col.type], nullable=True))
        path = directory / f"{name}.parquet"
        pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), path)
        written.append({"table": name, "rows": block.rows, "path": str(path)})
    return written


def write_csv(tables: Tables, directory: Path) -> list[dict[str, Any]]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in tables.table_names():
        block = tables.block(name)
        path = directory / f"{name}.csv"
        columns = [block.column(c) for c in block.spec.column_names]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(block.spec.column_names)
            for row in zip(*columns, strict=True):
                writer.writerow([_cell(v) for v in row])
        written.append({"table": name, "rows": block.rows, "path": str(path)})
    return written


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return float_text(value)
    return value
