"""`torchdoctor ENDPOINT eval "CODE"`: run Python in the target's __main__ and show the result.

This is remote code execution by design: it runs with the target's rights, in its process.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchdoctor.cli import formats
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError

NAME = "eval"
SUMMARY = "run Python code in the live process's __main__ globals"
TARGET = "live"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", help="Python code; '-' reads it from stdin")


def main(args: Any, ctx: Any) -> int:
    code = sys.stdin.read() if args.code == "-" else args.code
    if not code.strip():
        raise CliError("eval: no code given")
    status, payload = ctx.client().request("POST", "/v1/eval", {"code": code})
    if args.format == "json":
        ctx.print(json.dumps(payload, indent=2))
        return OK if status == 200 else TARGET_ERROR
    output = payload.get("output") or ""
    if output:
        ctx.out.write(output if output.endswith("\n") else output + "\n")
    if payload.get("value") is not None:
        ctx.print(payload["value"])
    if status != 200:
        ctx.err.write(payload.get("error") or "eval failed\n")
        return TARGET_ERROR
    return OK
