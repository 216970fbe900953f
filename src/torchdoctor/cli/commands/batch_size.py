"""`torchdoctor batch-size` (not built yet)."""

from __future__ import annotations

import argparse
from typing import Any

from torchdoctor.cli.errors import CliError

NAME = "batch-size"
SUMMARY = "(coming soon)"
TARGET = "none"


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: Any, ctx: Any) -> int:
    raise CliError("batch-size is not built yet")
