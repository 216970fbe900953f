"""`torchdoctor metrics RUN_DIR|JOB_DIR`: a saved run's numbers in the Prometheus text format,
the same families a live process serves with `--metrics HOST:PORT` (for node_exporter's
textfile collector, a push gateway, or a look); `--format json` gives them as data."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "metrics"
SUMMARY = "a run's numbers in the Prometheus text format (what --metrics serves live)"
TARGET = "none"
FORMATS = formats.PROMETHEUS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a run or job directory")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli.saved import open_saved, warn_truncated
    from torchdoctor.probe.metrics import collect
    from torchdoctor.report.prometheus import render
    from torchdoctor.store.saved import RunNotFound

    run = open_saved(args.source, ctx)
    try:
        if not run.recorded():
            raise CliError(f"{args.source}: nothing was recorded there (no steps, no diagnoses)")
        families = collect(run)
    except (RunNotFound, OSError) as exc:
        raise CliError(str(exc)) from None
    warn_truncated(run, ctx)
    if args.format == "json":
        from torchdoctor._json import clean

        ctx.print(json.dumps(clean([f.to_dict() for f in families]), indent=1))
    else:
        ctx.print(render(families).rstrip("\n"))
    return OK
