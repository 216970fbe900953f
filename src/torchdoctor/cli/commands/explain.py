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
import dataclasses
import io
import os
import sys
from typing import TYPE_CHECKING, BinaryIO

from torchdoctor.cli.errors import OK, CliError
from torchdoctor.errors.edges import EDGE
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "explain"
SUMMARY = "an error message, traceback or log -> category, meaning, causes, fixes"
TARGET = "none"
FORMATS = formats.REPORT

# A longer log is explained from its first HEAD_BYTES (where a job prints its environment:
# errors/edges.py) and its last TAIL_BYTES (where it meets its error): a log is read at about
# 1 s per MB, and the error of a long run is at its end, which its first bytes never reach.
HEAD_BYTES = EDGE
TAIL_BYTES = 8 * 1024 * 1024


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


@dataclasses.dataclass
class Read:
    """The text to explain: the whole input, or its two ends (`skipped` lines left out after
    line `cut` of the input)."""

    text: str
    cut: int = 0
    skipped: int = 0


def _read(path: str, ctx: Context) -> Read:
    if path == "-":
        if sys.stdin is None:
            raise CliError("explain: no input (give a FILE or pipe the error into stdin)")
        stream = getattr(sys.stdin, "buffer", None)  # None: a text stream put in its place
        if stream is None:
            stream = io.BytesIO(sys.stdin.read().encode("utf-8", errors="replace"))
        return _edges(stream, "the input", ctx)
    try:
        with open(path, "rb") as f:
            return _edges(f, path, ctx)
    except FileNotFoundError:
        raise CliError(f"explain: no such file: {path}") from None
    except IsADirectoryError:
        raise CliError(f"explain: {path} is a directory") from None
    except OSError as exc:
        raise CliError(f"explain: cannot read {path}: {exc.strerror or exc}") from None


def _edges(stream: BinaryIO, name: str, ctx: Context) -> Read:
    """The whole input, or for a longer one its first and last bytes cut at whole lines (and
    a line on stderr that says so). A file's middle is read only to count its lines; a pipe
    is read through, holding no more than its tail."""
    data = stream.read(HEAD_BYTES + TAIL_BYTES + 1)
    if len(data) <= HEAD_BYTES + TAIL_BYTES:
        return Read(data.decode("utf-8", errors="replace"))
    cut = data.rfind(b"\n", 0, HEAD_BYTES) + 1
    head, kept, skipped, total = data[:cut], bytearray(data[cut:]), 0, len(data)
    while chunk := stream.read(1 << 20):
        total += len(chunk)
        kept += chunk
        if len(kept) > 2 * TAIL_BYTES:  # drop what the tail no longer needs, lines counted
            skipped += kept.count(b"\n", 0, len(kept) - TAIL_BYTES)
            del kept[: len(kept) - TAIL_BYTES]
    start = kept.find(b"\n", len(kept) - TAIL_BYTES) + 1
    skipped += kept.count(b"\n", 0, start)
    from torchdoctor.units import human

    lines = head.count(b"\n")
    ctx.warn(
        f"torchdoctor: {name} is {human(total)}: explained from its first {lines:,} lines and "
        f"its last {human(TAIL_BYTES)} ({skipped:,} lines between them not read)"
    )
    return Read((head + kept[start:]).decode("utf-8", errors="replace"), lines, skipped)


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
        read = Read(text)
        if not text.strip():
            raise CliError(f"explain: the run in {args.file} recorded no error")
        here = meta["here"] if here is None else here
        base = meta.get("cwd") if here else None
    else:
        read = _read(args.file, ctx)
        text = read.text
    if not text.strip():
        raise CliError("explain: the input is empty; paste the error message or the log")
    if here:
        from torchdoctor.evidence import explain_here

        result = explain_here(text, base=base if base and os.path.isdir(base) else None)
    else:
        from torchdoctor.errors.api import explain_text

        result = explain_text(text)
    result.lines_skipped(read.cut, read.skipped)
    ctx.print(report.render(result, args.format))
    return OK
