"""`torchdoctor ENDPOINT query "SQL"` over a live process, or `torchdoctor query RUN_DIR "SQL"`
over a saved run. Both use the same tables and the same DuckDB settings."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats
from torchdoctor.report.tabular import render

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "query"
SUMMARY = "SQL over the telemetry tables (live: ENDPOINT query SQL; saved: query RUN_DIR SQL)"
TARGET = "optional"
FORMATS = formats.ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")
    parser.add_argument("sql", help="the query; tables are python.<name>; '-' reads stdin")


def main(args: argparse.Namespace, ctx: Context) -> int:
    sql = _read_sql(args.sql)
    if args.source is not None:
        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        return _saved(args.source, sql, args, ctx)
    status, payload = ctx.client().request(
        "POST", "/v1/query", {"sql": sql, "timeout": ctx.timeout}
    )
    if status != 200:
        ctx.warn(f"torchdoctor: query failed: {payload.get('error')}")
        return TARGET_ERROR
    _show(payload["columns"], payload["rows"], payload.get("truncated", False), args, ctx)
    return OK


def _read_sql(text: str) -> str:
    if text == "-":
        import sys

        return sys.stdin.read()
    return text


def _saved(source: str, sql: str, args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli.saved import open_saved, warn_truncated
    from torchdoctor.sql.engine import SqlEngine, SqlError
    from torchdoctor.store.saved import RunNotFound

    run = open_saved(source, ctx)
    try:
        result = SqlEngine(run).execute(sql, timeout=ctx.timeout)
    except SqlError as exc:
        ctx.warn(f"torchdoctor: query failed: {exc}")
        return TARGET_ERROR
    except RunNotFound as exc:  # a table file that turned out unreadable
        raise CliError(str(exc)) from None
    warn_truncated(run, ctx)
    _show(result.columns, result.rows, result.truncated, args, ctx)
    return OK


def _show(
    columns: list[str], rows: list[Any], truncated: bool, args: argparse.Namespace, ctx: Context
) -> None:
    ctx.print(render(columns, rows, args.format))
    if truncated:
        ctx.warn(f"torchdoctor: only the first {len(rows)} rows are shown; add a LIMIT")
