"""`torchdoctor [ENDPOINT] memory` (a live process) or `torchdoctor memory RUN_DIR` (a saved
run): where the memory is. Live: the tensor census by kind and the largest tensors; both: memory
by phase of the last traced step, the modules whose forward added most, and the full report of
an out-of-memory error."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchdoctor._json import dumps
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "memory"
SUMMARY = "where the memory is: tensors by kind, phases, modules, the OOM report"
TARGET = "optional"
FORMATS = formats.REPORT


class _TargetError(Exception):
    pass


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")
    parser.add_argument("--top", type=int, default=10, help="largest tensors to list (live)")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.memory.view import gather
    from torchdoctor.report.memory import render_view

    if args.top < 0:
        raise CliError("memory: --top must be >= 0")
    try:
        if args.source is not None:
            if ctx.endpoint is not None:
                raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
            view = gather(_saved_execute(args.source, ctx), live=False, top=args.top)
        else:
            view = gather(_live_execute(ctx), live=True, top=args.top)
    except _TargetError as exc:
        ctx.warn(f"torchdoctor: memory: {exc}")
        return TARGET_ERROR
    if args.format == "json":
        ctx.print(dumps(view, indent=2))
    else:
        ctx.print(render_view(view).rstrip("\n"))
    return OK


def _live_execute(ctx: Context) -> Any:
    client = ctx.client()

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        status, payload = client.request("POST", "/v1/query", {"sql": sql, "timeout": ctx.timeout})
        if status != 200:
            raise _TargetError(str(payload.get("error")))
        return list(payload["columns"]), list(payload["rows"])

    return execute


def _saved_execute(source: str, ctx: Context) -> Any:
    from torchdoctor.cli.saved import open_saved
    from torchdoctor.sql.engine import SqlEngine, SqlError

    engine = SqlEngine(open_saved(source, ctx))

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        try:
            result = engine.execute(sql, timeout=ctx.timeout)
        except SqlError as exc:
            raise _TargetError(str(exc)) from None
        return result.columns, [list(r) for r in result.rows]

    return execute
