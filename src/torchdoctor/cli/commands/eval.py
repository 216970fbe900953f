"""`torchdoctor ENDPOINT eval "CODE"`: run Python in the target's __main__ and show the result;
names that are not globals of __main__ come from the training loop's frames (`--frame`).

This is remote code execution by design: it runs with the target's rights, in its process.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "eval"
SUMMARY = "run Python code in the live process's __main__ globals"
TARGET = "live"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    from torchdoctor.probe.eval_at import AT_CHOICES

    parser.add_argument("code", help="Python code; '-' reads it from stdin")
    parser.add_argument(
        "--at",
        choices=AT_CHOICES,
        default="auto",
        help="step: on the training thread between two optimizer steps (a consistent state); "
        "now: at once on the probe's thread; auto (default): step while the training steps, "
        "now when it is stuck",
    )
    parser.add_argument(
        "--frame",
        metavar="FUNC|N",
        help="look up names in this frame of the training thread first (a function's name, "
        "or N: 0 is the innermost of the script's frames); by default a name that is not a "
        "global of __main__ comes from the innermost frame that has it",
    )


def main(args: argparse.Namespace, ctx: Context) -> int:
    code = sys.stdin.read() if args.code == "-" else args.code
    if not code.strip():
        raise CliError("eval: no code given")
    request = {"code": code, "at": args.at}
    if args.frame is not None:
        request["frame"] = args.frame
    status, payload = ctx.client().request("POST", "/v1/eval", request)
    if args.format == "json":
        ctx.print(json.dumps(payload, indent=2))
        return OK if status == 200 else TARGET_ERROR
    output = payload.get("output") or ""
    if output:
        ctx.out.write(output if output.endswith("\n") else output + "\n")
    if payload.get("value") is not None:
        ctx.print(payload["value"])
    ran = payload.get("ran")
    if ran and ran.get("note"):  # on stderr: stdout stays the code's own output
        ctx.err.write(f"# {ran['note']}\n")
    for used in payload.get("frames") or []:
        ctx.err.write(f"# {', '.join(used['names'])}: from {used['frame']}\n")
    if status != 200:
        ctx.err.write(payload.get("error") or "eval failed\n")
        return TARGET_ERROR
    return OK
