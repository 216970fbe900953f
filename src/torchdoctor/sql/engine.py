"""Runs user SQL over the tables with DuckDB, safely.

The database is in memory, with external access disabled (no files, no network, no extensions)
and its configuration locked, one thread and a memory cap so a query cannot starve training.
Each query sees fresh snapshots of the tables it names; the rest are present but empty, so
catalog queries still list every table and column.

DuckDB reads NaN in a numpy float column as NULL. A NaN loss is the whole point of some
queries, so each float column travels with a NaN flag column and the view puts NaN back.
"""

from __future__ import annotations

import atexit
import dataclasses
import re
import threading
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from torchdoctor.store.columns import Block
from torchdoctor.store.schema import BOOL, BY_NAME, FLOAT, INT, STR, TableSpec

SCHEMA = "python"
DEFAULT_TIMEOUT = 10.0
MAX_ROWS = 100_000
FETCH_ROWS = 2_000
_SQL_TYPES = {INT: "BIGINT", FLOAT: "DOUBLE", STR: "VARCHAR", BOOL: "BOOLEAN"}
_STRINGS_AND_COMMENTS = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.S)
_TABLE_REF = re.compile(r'\bpython\s*\.\s*"?([A-Za-z_][A-Za-z0-9_]*)"?', re.I)


class SqlError(Exception):
    """The query failed: DuckDB's own message, or the time limit."""


class TableSource(Protocol):
    def table_names(self) -> Iterable[str]: ...

    def block(self, name: str) -> Block: ...


def _spec(source: TableSource, name: str) -> TableSpec:
    # A job's saved tables carry a rank column that a process's own tables may lack: a source
    # that reshapes a table says so with spec(name).
    spec = getattr(source, "spec", None)
    return spec(name) if spec is not None else BY_NAME[name]


@dataclasses.dataclass
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False


def referenced_tables(sql: str) -> set[str]:
    """Names of python.<table> the query mentions, outside string literals and comments."""
    code = _STRINGS_AND_COMMENTS.sub(" ", sql)
    return {m.group(1).lower() for m in _TABLE_REF.finditer(code)}


class SqlEngine:
    def __init__(self, source: TableSource, memory_limit: str = "512MB") -> None:
        self.source = source
        self._memory_limit = memory_limit
        self._con: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> Any:
        import duckdb  # imported on first query: nothing to pay until someone asks

        con = duckdb.connect(
            ":memory:",
            config={
                "enable_external_access": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "threads": 1,
                "memory_limit": self._memory_limit,
            },
        )
        con.execute(f"CREATE SCHEMA {SCHEMA}")
        con.execute("SET lock_configuration = true")
        # An open DuckDB connection at interpreter exit can abort the process: close it first.
        atexit.register(self.close)
        return con

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
        # Closed: nothing for exit to do, and nothing to keep this engine (and a session's
        # tables behind it) alive after its session in a process that goes on.
        atexit.unregister(self.close)

    def execute(
        self, sql: str, timeout: float | None = None, max_rows: int = MAX_ROWS
    ) -> QueryResult:
        if not sql or not sql.strip():
            raise SqlError("empty query")
        wanted = referenced_tables(sql)
        with self._lock:
            if self._con is None:
                self._con = self._connect()
                for name in self.source.table_names():  # every table exists, empty at rest
                    spec = _spec(self.source, name)
                    self._con.register(f"__td_{name}", _arrays(Block.empty(spec)))
                    self._con.execute(_view_sql(spec))
            con = self._con
            names = [n for n in self.source.table_names() if n in wanted]
            for name in names:
                con.register(f"__td_{name}", _arrays(self.source.block(name)))
                con.execute(_view_sql(_spec(self.source, name)))  # a query may have dropped it
            try:
                return self._run(con, sql, timeout, max_rows)
            finally:
                for name in names:  # back to empty: the snapshot's memory is not kept
                    con.register(f"__td_{name}", _arrays(Block.empty(_spec(self.source, name))))

    def _run(self, con: Any, sql: str, timeout: float | None, max_rows: int) -> QueryResult:
        timer = threading.Timer(timeout or DEFAULT_TIMEOUT, con.interrupt)
        timer.daemon = True
        timer.start()
        try:
            cursor = con.execute(sql)
            if cursor.description is None:
                return QueryResult([], [], [])
            # In chunks: converting rows to Python holds the GIL, and the training thread
            # must get it back every few milliseconds.
            rows: list[Any] = []
            while len(rows) <= max_rows:
                chunk = cursor.fetchmany(min(FETCH_ROWS, max_rows + 1 - len(rows)))
                if not chunk:
                    break
                rows.extend(chunk)
            description = cursor.description
            if hasattr(con, "abort"):  # DuckDB 2: rows left unfetched block the connection
                con.abort()
        except Exception as exc:
            if type(exc).__name__ == "InterruptException":
                raise SqlError(
                    f"query stopped after the {timeout or DEFAULT_TIMEOUT:g} s time limit"
                ) from None
            raise SqlError(_clean(str(exc))) from None
        finally:
            timer.cancel()
        columns = [d[0] for d in description]
        types = [str(d[1]) for d in description]
        truncated = len(rows) > max_rows
        return QueryResult(columns, types, [tuple(r) for r in rows[:max_rows]], truncated)


def _arrays(block: Block) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for col in block.spec.columns:
        values = block.data[col.name]
        mask = block.nulls.get(col.name)
        if col.type == FLOAT:
            nan = np.isnan(values)
            out[f"__nan_{col.name}"] = nan if mask is None else nan & ~mask
        out[col.name] = values if mask is None else np.ma.masked_array(values, mask=mask)
    return out


def _view_sql(spec: TableSpec) -> str:
    exprs = []
    for col in spec.columns:
        name = f'"{col.name}"'
        sql_type = _SQL_TYPES[col.type]
        if col.type == FLOAT:
            value = f"CASE WHEN \"__nan_{col.name}\" THEN 'NaN'::DOUBLE ELSE {name} END"
        else:
            value = name
        exprs.append(f"CAST({value} AS {sql_type}) AS {name}")
    columns = ", ".join(exprs)
    return f"CREATE OR REPLACE VIEW {SCHEMA}.{spec.name} AS SELECT {columns} FROM __td_{spec.name}"


def _clean(message: str) -> str:
    # DuckDB names our hidden objects in some messages; say the user's names instead.
    return re.sub(r"__td_([A-Za-z_]+)", r"python.\1", message)
