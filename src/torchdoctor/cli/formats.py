"""The `--format` choices, one declaration per kind of output. A verb names its kind in its
module (`FORMATS = formats.REPORT`); cli/main.py adds the option from it; the first choice is
the default."""

from __future__ import annotations

REPORT = ("text", "json")  # a report for people, or its data as JSON
ROWS = ("table", "json", "csv")  # the rows of a table
VIEW_OR_ROWS = ("text", "table", "json", "csv")  # a view made for reading, or its rows
PAGE = ("html", "json")  # a page, or its data
PROMETHEUS = ("prometheus", "json")  # the exposition format, or its data

HELP = {
    REPORT: "text for people, or json",
    ROWS: "table (aligned columns), json (a list of objects) or csv",
    VIEW_OR_ROWS: "text (a view), or the rows as table, json or csv",
    PAGE: "the html page, or its data as json",
    PROMETHEUS: "the Prometheus text format, or json",
}


def add(parser: object, choices: tuple[str, ...]) -> None:
    parser.add_argument(  # type: ignore[attr-defined]
        "--format", choices=choices, default=choices[0], help=HELP.get(choices, "output format")
    )
