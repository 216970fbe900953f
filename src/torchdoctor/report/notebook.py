"""What the `%torchdoctor` magic shows in a notebook: query results as an HTML table (with the
text table as the plain-text fallback) and the report page inline, isolated in an iframe."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from torchdoctor.report.tabular import _cell, render

MAX_HTML_ROWS = 1000  # the rest is counted, not shown: a notebook is not a spreadsheet


class QueryTable:
    """Rows shown by IPython's display(): HTML in a notebook, text in a terminal."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.columns = list(columns)
        self.rows = [list(r) for r in rows]

    def __repr__(self) -> str:
        return render(self.columns, self.rows, "table")

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for row in self.rows[:MAX_HTML_ROWS]:
            cells = "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row)
            body.append(f"<tr>{cells}</tr>")
        more = len(self.rows) - MAX_HTML_ROWS
        note = f"<p>{len(self.rows)} rows; the first {MAX_HTML_ROWS} shown</p>" if more > 0 else ""
        return (
            f'<table class="torchdoctor-query"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{note}"
        )


def inline_page(page: str, height: int = 820) -> str:
    """A whole HTML page inside an iframe's srcdoc: its scripts and styles stay its own."""
    return (
        f'<div class="torchdoctor-report"><iframe srcdoc="{html.escape(page, quote=True)}" '
        f'style="width: 100%; height: {height}px; border: 1px solid #ddd"></iframe></div>'
    )
