"""`torchdoctor report RUN_DIR|JOB_DIR -o FILE.html` (or `torchdoctor ENDPOINT report ...` for a
live process): one self-contained page with the run's charts and diagnoses. `--format json`
writes the same data as JSON instead."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from torchdoctor.cli import formats
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError

NAME = "report"
SUMMARY = "a self-contained HTML report of a run or job: charts, diagnoses, fixes"
TARGET = "optional"
FORMATS = formats.PAGE


class _TargetError(Exception):
    pass


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="where to write it ('-' or left out: stdout)"
    )


def main(args: Any, ctx: Any) -> int:
    from torchdoctor.digest.build import build
    from torchdoctor.report.run_report import render

    output = args.output or "-"
    if output == "-" and args.format == "html" and sys.stdout.isatty():
        raise CliError("report: give -o FILE.html (the page is not for a terminal)")
    started = time.perf_counter()
    try:
        if args.source is not None:
            if ctx.endpoint is not None:
                raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
            execute, meta, warnings, steps = _saved(args.source, ctx)
            label = args.source
        else:
            execute, meta, warnings = _live(ctx)
            steps = None  # fetched through the query route
            label = str(ctx.endpoint or f"process {meta.get('pid')}")
        digest = build(execute, meta, label, warnings, steps)
    except _TargetError as exc:
        ctx.warn(f"torchdoctor: report: {exc}")
        return TARGET_ERROR
    text = render(digest, args.format)
    if output == "-":
        ctx.print(text)
    else:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
        size = len(text.encode())
        ctx.warn(
            f"torchdoctor: wrote {output} ({size / 1e6:.1f} MB) in "
            f"{time.perf_counter() - started:.1f} s: {digest['summary'].get('steps', 0):,} steps, "
            f"{len(digest['diagnoses'])} diagnoses"
        )
    return OK


def _saved(source: str, ctx: Any) -> tuple[Any, dict[str, Any], list[str], Any]:
    from torchdoctor.cli.saved import open_saved
    from torchdoctor.digest.build import step_columns
    from torchdoctor.sql.engine import SqlEngine, SqlError
    from torchdoctor.store.saved import RunNotFound

    run = open_saved(source, ctx)
    try:
        recorded = run.recorded()
    except OSError as exc:
        raise CliError(f"cannot read {source}: {exc.strerror or exc}") from None
    if not recorded:
        raise CliError(f"{source}: nothing was recorded there (no steps, no diagnoses)")
    engine = SqlEngine(run)

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        try:
            result = engine.execute(sql, timeout=ctx.timeout)
        except SqlError as exc:
            raise _TargetError(str(exc)) from None
        except RunNotFound as exc:
            raise CliError(str(exc)) from None
        return result.columns, result.rows

    try:
        steps = step_columns(run.block("steps"))
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    return execute, dict(run.meta), list(run.warnings), steps


def _live(ctx: Any) -> tuple[Any, dict[str, Any], list[str]]:
    client = ctx.client()
    _status, meta = client.request("GET", "/v1/status")

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        status, payload = client.request("POST", "/v1/query", {"sql": sql, "timeout": ctx.timeout})
        if status != 200:
            raise _TargetError(str(payload.get("error")))
        return list(payload["columns"]), list(payload["rows"])

    return execute, dict(meta), []
