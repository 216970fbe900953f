"""Opening a saved run or job directory for a verb: the one place that turns a directory that
cannot be read into a usage error (exit 2) and says what was left out of a job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchdoctor.cli.errors import CliError
from torchdoctor.store.saved import JobRun, RunNotFound, SavedRun, open_run

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context


def open_saved(source: str, ctx: Context) -> SavedRun | JobRun:
    try:
        run = open_run(source)
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    for warning in run.warnings:
        ctx.warn(f"torchdoctor: {warning}")
    return run


def warn_truncated(run: SavedRun | JobRun, ctx: Context) -> None:
    for name in run.truncated:
        ctx.warn(f"torchdoctor: {name}: the last batch was cut short (killed run?) and skipped")
