"""`torchdoctor list`: this user's probed processes on this machine, those started from the
current directory first: pid, state, when it started, from where, the script and arguments."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "list"
SUMMARY = "probed processes of this user: pid, state, started, directory, script and arguments"
TARGET = "none"
FORMATS = formats.ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-step", action="store_true", help="do not ask each process its state")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli import processes

    found = processes.entries()
    statuses = None if args.no_step else {e["pid"]: processes.ask_status(e) for e in found}
    if args.format == "json":
        records = [
            processes.record(e, (statuses or {}).get(e["pid"]), statuses is not None) for e in found
        ]
        ctx.print(json.dumps(records, indent=2))
        return OK
    if not found and args.format == "table":
        ctx.print("no probed processes")
        return OK
    ctx.print(processes.table(found, statuses, args.format))
    return OK
