"""`torchdoctor ENDPOINT backtrace`: every thread's stack, innermost frame first."""

from __future__ import annotations

import argparse
from typing import Any

from torchdoctor.cli import formats
from torchdoctor.cli.errors import OK
from torchdoctor.report import stacks
from torchdoctor.report.tabular import render

NAME = "backtrace"
SUMMARY = "stacks of all threads of a live process, innermost frame first"
TARGET = "live"
FORMATS = formats.VIEW_OR_ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    """No options of its own (the endpoint and --format are common)."""


def main(args: Any, ctx: Any) -> int:
    _status, payload = ctx.client().request("GET", "/v1/backtrace")
    columns, rows = payload["columns"], payload["rows"]
    if args.format == "text":
        ctx.print(stacks.render_text(columns, rows))
    else:
        ctx.print(render(columns, rows, args.format))
    return OK
