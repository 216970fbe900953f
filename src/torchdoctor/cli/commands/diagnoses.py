"""`torchdoctor ENDPOINT diagnoses` (live) or `torchdoctor diagnoses RUN_DIR` (saved)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchdoctor.cli import formats
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report.diagnoses import render_full

NAME = "diagnoses"
SUMMARY = "the problems found in a run, with evidence and ranked fixes"
TARGET = "optional"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")


def main(args: Any, ctx: Any) -> int:
    if args.source is not None:
        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        from torchdoctor.cli.saved import open_saved

        run = open_saved(args.source, ctx)
        records = run.block("diagnoses").to_records()
        for r in records:
            r["evidence"] = _evidence(r.get("evidence"))
    else:
        status, payload = ctx.client().request("GET", "/v1/diagnoses")
        if status != 200:
            ctx.warn(f"torchdoctor: {payload.get('error')}")
            return TARGET_ERROR
        records = [dict(zip(payload["columns"], row, strict=True)) for row in payload["rows"]]
        for r in records:
            r["evidence"] = _evidence(r.get("evidence"))
    if args.format == "json":
        ctx.print(json.dumps(records, indent=2))
    else:
        ctx.print(render_full(records))
    return OK


def _evidence(text: Any) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text
