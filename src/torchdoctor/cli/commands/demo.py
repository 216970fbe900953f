"""`torchdoctor demo [NAME]`: run a bundled training script with a planted problem, under
`torchdoctor run`, and show what torchdoctor finds. `--list` shows the choices."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, CliError

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "demo"
SUMMARY = "a bundled training run with a planted problem (--list shows them)"
TARGET = "none"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="which demo (default: nan)")
    parser.add_argument("--list", action="store_true", help="list the demos")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.demos import DEFAULT, DEMOS

    if args.list:
        for name, (_file, planted, _opts) in DEMOS.items():
            ctx.print(f"  {name:<12} {planted}")
        return OK
    name = args.name or DEFAULT
    if name not in DEMOS:
        raise CliError(f"demo: no demo called {name!r}; choose from {', '.join(DEMOS)}")
    file, planted, options = DEMOS[name]
    script = Path(__file__).resolve().parent.parent.parent / "demos" / file
    ctx.print(f"torchdoctor demo '{name}': {planted}")
    ctx.print(f"running: {' '.join(['torchdoctor', 'run', *options, script.name])}\n")
    sys.stdout.flush()
    command = [sys.executable, "-m", "torchdoctor", "run", *options, str(script)]
    code = subprocess.call(command)
    ctx.print(f"\n(the script exited with {code}; `torchdoctor demo --list` shows the others)")
    return OK
