"""`torchdoctor memory` (not built yet)."""

from __future__ import annotations

import argparse
from typing import Any

from torchdoctor.cli.errors import CliError

NAME = "memory"
SUMMARY = "(coming soon)"
TARGET = "none"


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: Any, ctx: Any) -> int:
    raise CliError("memory is not built yet")
