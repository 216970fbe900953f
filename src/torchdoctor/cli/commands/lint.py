"""`torchdoctor lint PATH...`: static checks of training code (see docs/lint.md).

Exit codes: 0 no problems, 1 problems found (a file that does not parse counts, as TD000),
2 usage errors (a missing path, an unknown rule code). Never imports torch.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "lint"
SUMMARY = "static checks of training code for known anti-patterns (TDnnn rules)"
TARGET = "none"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories")
    parser.add_argument(
        "--select", action="append", metavar="CODES", help="only these rules (TD101,TD2,...)"
    )
    parser.add_argument(
        "--ignore", action="append", metavar="CODES", help="skip these rules (codes or prefixes)"
    )
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    parser.add_argument("--rule", metavar="CODE", help="explain one rule and exit")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.lint.engine import SelectionError, lint_paths, select_rules
    from torchdoctor.lint.rules import all_rules, by_code
    from torchdoctor.report import lint as report

    if args.rule:
        rule = by_code(args.rule.upper())
        if rule is None:
            raise CliError(f"lint: no rule {args.rule!r}; `torchdoctor lint --list-rules`")
        ctx.print(report.rules_json([rule]) if args.format == "json" else report.rule_text(rule))
        return OK
    if args.list_rules:
        try:
            rules = select_rules(all_rules(), args.select, args.ignore)
        except SelectionError as exc:
            raise CliError(f"lint: {exc}") from None
        ctx.print(report.rules_json(rules) if args.format == "json" else report.rules_text(rules))
        return OK
    if not args.paths:
        raise CliError("lint: give at least one PATH (a file or a directory)")
    try:
        result = lint_paths(args.paths, select_rules(all_rules(), args.select, args.ignore))
    except SelectionError as exc:
        raise CliError(f"lint: {exc}; `torchdoctor lint --list-rules` shows the codes") from None
    except FileNotFoundError as exc:
        raise CliError(f"lint: no such file or directory: {exc.args[0]}") from None
    ctx.print(report.render(result.findings, result.files, args.format))
    for error in result.errors:
        ctx.warn(f"torchdoctor: lint: internal error, please report it: {error}")
    return TARGET_ERROR if result.findings else OK
