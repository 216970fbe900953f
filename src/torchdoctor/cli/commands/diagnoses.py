"""`torchdoctor ENDPOINT diagnoses` (live) or `torchdoctor diagnoses RUN_DIR` (saved)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report.diagnoses import render_full

NAME = "diagnoses"
SUMMARY = "the problems found in a run, with evidence and ranked fixes"
TARGET = "optional"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run directory (for a saved run)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def main(args: Any, ctx: Any) -> int:
    if args.source is not None:
        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        from torchdoctor.store import rundir
        from torchdoctor.store.saved import RunNotFound, SavedRun

        try:
            SavedRun(args.source)
        except RunNotFound as exc:
            raise CliError(str(exc)) from None
        records = _read_jsonl(args.source + "/" + rundir.DIAGNOSES_FILE)
    else:
        status, payload = ctx.client().request("GET", "/v1/diagnoses")
        if status != 200:
            ctx.warn(f"torchdoctor: {payload.get('error')}")
            return TARGET_ERROR
        records = [dict(zip(payload["columns"], row, strict=True)) for row in payload["rows"]]
        for r in records:
            r["evidence"] = json.loads(r.get("evidence") or "{}")
    if args.format == "json":
        ctx.print(json.dumps(records, indent=2))
    else:
        ctx.print(render_full(records))
    return OK


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        return []
    return out
