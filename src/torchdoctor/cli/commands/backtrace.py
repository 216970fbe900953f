"""`torchdoctor ENDPOINT backtrace`: every thread's stack, innermost frame first."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK
from torchdoctor.report import formats, stacks
from torchdoctor.report.tabular import render

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "backtrace"
SUMMARY = "stacks of all threads of a live process, innermost frame first"
TARGET = "live"
FORMATS = formats.VIEW_OR_ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    """No options of its own (the endpoint and --format are common)."""


def main(args: argparse.Namespace, ctx: Context) -> int:
    _status, payload = ctx.client().request("GET", "/v1/backtrace")
    columns, rows = payload["columns"], payload["rows"]
    if args.format == "text":
        ctx.print(stacks.render_text(columns, rows))
    else:
        ctx.print(render(columns, rows, args.format))
    return OK
