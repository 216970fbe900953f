"""`torchdoctor export RUN_DIR|JOB_DIR --perfetto FILE.json` (a trace for Perfetto or
chrome://tracing), `--parquet DIR` or `--csv DIR` (every table, for pandas and polars)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import OK, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context
    from torchdoctor.store.saved import JobRun, SavedRun

NAME = "export"
SUMMARY = "a saved run or job as a Perfetto trace, or its tables as Parquet or CSV"
TARGET = "none"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a run or job directory")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", metavar="FILE.json", help="Chrome trace-event JSON")
    what.add_argument("--parquet", metavar="DIR", help="one <table>.parquet per table")
    what.add_argument("--csv", metavar="DIR", help="one <table>.csv per table")
    parser.add_argument(
        "--steps", metavar="FROM:TO", help="Perfetto: only these steps (inclusive), e.g. 100:200"
    )


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli.saved import open_saved, warn_truncated
    from torchdoctor.store.saved import RunNotFound

    window = _window(args.steps) if args.steps else None
    if window is not None and not args.perfetto:
        raise CliError("export: --steps goes with --perfetto")
    run = open_saved(args.source, ctx)
    try:
        if not run.recorded():
            raise CliError(f"{args.source}: nothing was recorded there (no steps, no diagnoses)")
        started = time.perf_counter()
        if args.perfetto:
            report = _perfetto(run, Path(args.perfetto), window)
        else:
            report = _tables(
                run, Path(args.parquet or args.csv), "parquet" if args.parquet else "csv"
            )
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(
            f"export: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        ) from None
    report["seconds"] = round(time.perf_counter() - started, 3)
    warn_truncated(run, ctx)
    if args.format == "json":
        ctx.print(json.dumps(report, indent=2))
    elif "events" in report:
        ev = report["events"]
        ctx.print(
            f"wrote {report['path']}: {ev['steps']} steps, {ev['phases']} phases, "
            f"{ev['modules']} module calls, {ev['collectives']} collectives, "
            f"{ev['diagnoses']} diagnoses; open it in https://ui.perfetto.dev or chrome://tracing"
        )
    else:
        for t in report["tables"]:
            ctx.print(f"{t['path']}  {t['rows']} rows")
    return OK


def _perfetto(run: SavedRun | JobRun, path: Path, window: tuple[int, int] | None) -> dict[str, Any]:
    from torchdoctor.report.perfetto import write

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        events = write(run, f, window)
    tmp.replace(path)  # a reader never sees half a trace
    return {"format": "perfetto", "path": str(path), "bytes": path.stat().st_size, "events": events}


def _tables(run: SavedRun | JobRun, directory: Path, fmt: str) -> dict[str, Any]:
    from torchdoctor.store.export import ExportError, write_csv, write_parquet

    try:
        written = write_parquet(run, directory) if fmt == "parquet" else write_csv(run, directory)
    except ExportError as exc:
        raise CliError(str(exc)) from None
    return {"format": fmt, "directory": str(directory), "tables": written}


def _window(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        start = int(lo) if lo else 0
        end = int(hi) if hi else 2**62
    except ValueError:
        raise CliError(f"export: --steps wants FROM:TO (e.g. 100:200), not {text!r}") from None
    if not sep or end < start:
        raise CliError(f"export: --steps wants FROM:TO with FROM <= TO, not {text!r}")
    return start, end
