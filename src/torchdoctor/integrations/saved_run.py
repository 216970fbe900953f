"""A saved run (or job) directory opened for reading by the integrations, with the same clear
errors the CLI gives: missing, not a run, empty, unreadable, nothing recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchdoctor.store.saved import RunNotFound, open_run


def open_recorded(path: str | Path) -> Any:
    """The SavedRun or JobRun at `path`; RunNotFound (with why) when there is nothing to read."""
    run = open_run(path)
    try:
        recorded = run.recorded()
    except OSError as exc:
        raise RunNotFound(f"cannot read {path}: {exc.strerror or exc}") from None
    if not recorded:
        raise RunNotFound(f"{path}: nothing was recorded there (no steps, no diagnoses)")
    return run
