"""`torchdoctor ENDPOINT tables` (or `tables RUN_DIR`): schemas, tables and their columns."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, CliError
from torchdoctor.report import formats
from torchdoctor.report.tabular import render

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "tables"
SUMMARY = "list the tables and columns that SQL can use"
TARGET = "optional"
FORMATS = formats.VIEW_OR_ROWS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")


def main(args: argparse.Namespace, ctx: Context) -> int:
    if args.source is not None:
        from torchdoctor.cli.saved import open_saved
        from torchdoctor.store.schema import describe_specs

        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        run = open_saved(args.source, ctx)
        tables = describe_specs([run.spec(name) for name in run.table_names()])
    else:
        _status, payload = ctx.client().request("GET", "/v1/tables")
        tables = payload["tables"]
    if args.format == "json":
        ctx.print(json.dumps(tables, indent=2))
    elif args.format in ("table", "csv"):
        rows = [
            (t["schema"], t["name"], c["name"], c["type"], c["nullable"], c["doc"])
            for t in tables
            for c in t["columns"]
        ]
        ctx.print(
            render(["schema", "table", "column", "type", "nullable", "doc"], rows, args.format)
        )
    else:
        for t in tables:
            live = " (live: taken at query time)" if t.get("live") else ""
            ctx.print(f"{t['schema']}.{t['name']}{live}: {t['doc']}")
            for c in t["columns"]:
                null = " NULL" if c["nullable"] else ""
                doc = f"  -- {c['doc']}" if c["doc"] else ""
                ctx.print(f"    {c['name']:<16} {c['type']}{null}{doc}")
    return OK
