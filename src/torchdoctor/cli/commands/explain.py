"""`torchdoctor explain [FILE|RUN_DIR|-] [--here]`: an error message, a traceback or a whole
log in; its category, meaning, fields, ranked causes, first steps and fixes out.

Reads stdin when FILE is left out or is '-'; a run directory gives the error its run recorded.
With --here (the default for a run directory recorded on this host) the machine is evidence:
installed versions and builds, the GPUs and driver, the files the text names (torchdoctor.
evidence). Exit codes: 0 when the text was read, whether or not the error is recognised (JSON
says which in `recognised`; text says so plainly); 2 for usage errors (a missing file, empty
input). Never imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "explain"
SUMMARY = "an error message, traceback or log -> category, meaning, causes, fixes"
TARGET = "none"
FORMATS = formats.REPORT

MAX_BYTES = 64 * 1024 * 1024


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", nargs="?", default="-", help="a file holding the error or log ('-' or none: stdin)"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the categories torchdoctor recognises"
    )
    parser.add_argument(
        "--here",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the error happened on this machine: use its versions, GPUs, driver and the files "
        "the text names as evidence (default: on for a run directory recorded on this host)",
    )


def _read(path: str) -> str:
    if path == "-":
        if sys.stdin is None:
            raise CliError("explain: no input (give a FILE or pipe the error into stdin)")
        return sys.stdin.read(MAX_BYTES)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES)
    except FileNotFoundError:
        raise CliError(f"explain: no such file: {path}") from None
    except IsADirectoryError:
        raise CliError(f"explain: {path} is a directory") from None
    except OSError as exc:
        raise CliError(f"explain: cannot read {path}: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.report import explanation as report

    if args.list:
        ctx.print(report.catalog_json() if args.format == "json" else report.catalog_text())
        return OK
    if args.file == "-" and sys.stdin is not None and sys.stdin.isatty():
        ctx.warn("torchdoctor: paste the error, then Ctrl-D (or give a FILE)")
    here, base = args.here, None
    if args.file != "-" and os.path.isdir(args.file):
        from torchdoctor import evidence
        from torchdoctor.store.rundir import is_run_dir

        if not is_run_dir(args.file):
            raise CliError(f"explain: {args.file} is a directory, not a run directory")
        text, meta = evidence.from_run_dir(args.file)
        if not text.strip():
            raise CliError(f"explain: the run in {args.file} recorded no error")
        here = meta["here"] if here is None else here
        base = meta.get("cwd") if here else None
    else:
        text = _read(args.file)
    if not text.strip():
        raise CliError("explain: the input is empty; paste the error message or the log")
    if here:
        from torchdoctor.evidence import explain_here

        result = explain_here(text, base=base if base and os.path.isdir(base) else None)
    else:
        from torchdoctor.errors.api import explain_text

        result = explain_text(text)
    ctx.print(report.render(result, args.format))
    return OK
