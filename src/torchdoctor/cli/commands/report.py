"""`torchdoctor report RUN_DIR|JOB_DIR -o FILE.html` (or `torchdoctor ENDPOINT report ...` for a
live process): one self-contained page with the run's charts and diagnoses. `--format json`
writes the same data as JSON instead."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context
    from torchdoctor.compare.record import Comparison
    from torchdoctor.digest.record import Baseline

NAME = "report"
SUMMARY = "a self-contained HTML report of a run or job: charts, diagnoses, fixes"
TARGET = "optional"
FORMATS = formats.PAGE


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="where to write it ('-' or left out: stdout)"
    )
    parser.add_argument(
        "--baseline",
        metavar="RUN",
        help="a run or job directory (or a live endpoint) to compare with: its curves drawn "
        "dashed on the charts, and a 'Compared with' section (as `torchdoctor compare`)",
    )


def main(args: argparse.Namespace, ctx: Context) -> int:
    import dataclasses

    from torchdoctor.cli.run_source import SourceError, live, open_source
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
            source = open_source(args.source, ctx)
        else:
            source = live(ctx.client(), ctx)
        digest = build(source.execute, source.meta, source.label, source.warnings, _steps(source))
        comparison = None
        if args.baseline is not None:
            baseline, comparison = _baseline(open_source(args.baseline, ctx), source)
            digest = dataclasses.replace(digest, baseline=baseline)
    except SourceError as exc:
        ctx.warn(f"torchdoctor: report: {exc}")
        return TARGET_ERROR
    text = render(digest, args.format, comparison)
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
            f"{time.perf_counter() - started:.1f} s: {digest.summary.steps:,} steps, "
            f"{len(digest.diagnoses)} diagnoses"
        )
    return OK


def _steps(source: Any) -> Any:
    """A saved run's step columns straight from its files (None: fetched through SQL)."""
    from torchdoctor.digest.build import step_columns
    from torchdoctor.store.saved import RunNotFound

    if source.live:
        return None
    try:
        return step_columns(source.run.block("steps"))
    except RunNotFound as exc:
        raise CliError(str(exc)) from None


def _baseline(base: Any, this: Any) -> tuple[Baseline, Comparison]:
    """The baseline's curves (drawn under this run's) and the comparison, this run as B."""
    from torchdoctor.cli.commands.compare import facts
    from torchdoctor.compare.build import compare
    from torchdoctor.digest.build import build
    from torchdoctor.digest.record import Baseline

    other = build(base.execute, base.meta, base.label, base.warnings, _steps(base))
    comparison = compare(facts(base), facts(this))
    return Baseline(base.label, other.training, other.phases, other.memory), comparison
