"""`torchdoctor list`: this user's probed processes on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchdoctor import registry
from torchdoctor.cli import formats
from torchdoctor.cli.errors import OK, CliError
from torchdoctor.report.tabular import render

NAME = "list"
SUMMARY = "probed processes of this user: pid, endpoint, command, step"
TARGET = "none"
FORMATS = formats.ROWS


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
                "run_dir": e.get("run_dir"),
                "command": " ".join(e.get("command") or []),
            }
        )
    if args.format == "json":
        ctx.print(json.dumps(records, indent=2))
        return OK
    if not records and args.format == "table":
        ctx.print("no probed processes")
        return OK
    columns = ["pid", "endpoint", "step", "command"]
    ctx.print(render(columns, [[r[c] for c in columns] for r in records], args.format))
    return OK
