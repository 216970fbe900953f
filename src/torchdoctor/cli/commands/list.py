"""`torchdoctor list`: this user's probed processes on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchdoctor import registry
from torchdoctor.cli.errors import OK, CliError
from torchdoctor.redact import command_line
from torchdoctor.report import formats
from torchdoctor.report.tabular import render

NAME = "list"
SUMMARY = "probed processes of this user: pid, rank, endpoint, command, step"
TARGET = "none"
FORMATS = formats.ROWS
RANK_FIELDS = ("rank", "local_rank", "world_size", "node", "job")  # from the registry entry


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-step", action="store_true", help="do not ask each process its step")


def _step(entry: dict[str, Any]) -> Any:
    from torchdoctor.cli.client import Address, ProbeClient

    client = ProbeClient(Address(label=str(entry["pid"]), socket_path=entry["socket"]), timeout=2.0)
    try:
        _status, payload = client.request("GET", "/v1/status")
    except Exception:
        return None
    return payload.get("step")


def main(args: Any, ctx: Any) -> int:
    try:
        entries = registry.entries()
    except registry.InsecureDirectory as exc:
        raise CliError(str(exc)) from None
    records = []
    for e in entries:
        records.append(
            {
                "pid": e["pid"],
                "endpoint": e.get("tcp") or e["socket"],
                "socket": e["socket"],
                "tcp": e.get("tcp"),
                "step": None if args.no_step else _step(e),
                # A rank of a distributed job: its identity (None for other processes).
                **{field: e.get(field) for field in RANK_FIELDS},
                "run_dir": e.get("run_dir"),
                "command": command_line(e.get("command")),
            }
        )
    if args.format == "json":
        ctx.print(json.dumps(records, indent=2))
        return OK
    if not records and args.format == "table":
        ctx.print("no probed processes")
        return OK
    columns = ["pid", "endpoint", "step", "command"]
    if any(r["rank"] is not None for r in records):
        columns[1:1] = ["rank", "world_size", "node", "job"]
    ctx.print(render(columns, [[r[c] for c in columns] for r in records], args.format))
    return OK
