"""The HTML report of a run directory written to a file: the same page as `torchdoctor report
RUN_DIR -o FILE.html`, built in-process (digest, then the page)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchdoctor.digest.build import build, step_columns
from torchdoctor.integrations.saved_run import open_recorded
from torchdoctor.report.run_report import render
from torchdoctor.sql.engine import SqlEngine, SqlError
from torchdoctor.store.saved import RunNotFound

REPORT_FILE = "report.html"


def report_html(run_dir: str | Path) -> str:
    """The report page of a saved (or live, flushed) run; RunNotFound when it cannot be read."""
    run = open_recorded(run_dir)
    engine = SqlEngine(run)
    try:

        def execute(sql: str) -> tuple[list[str], list[Any]]:
            try:
                result = engine.execute(sql)
            except SqlError as exc:
                raise RunNotFound(f"cannot read {run_dir}: {exc}") from None
            return result.columns, result.rows

        steps = step_columns(run.block("steps"))
        digest = build(execute, dict(run.meta), str(run_dir), list(run.warnings), steps)
    finally:
        engine.close()
    return render(digest, "html")


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the report (default: RUN_DIR/report.html) and return where it went."""
    path = Path(output) if output is not None else Path(run_dir) / REPORT_FILE
    path.write_text(report_html(run_dir), encoding="utf-8")
    return path
