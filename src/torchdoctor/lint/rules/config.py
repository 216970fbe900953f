"""TD8xx script configuration: command-line options that do not mean what they say."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, keyword, method
from torchdoctor.lint.rule import Hit, Rule


def _bool_options(ctx: FileContext) -> Iterator[Hit]:
    if "bool" in ctx.bound:  # a function of the script's own called bool
        return
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if method(n) != "add_argument":
            continue
        kind = keyword(n, "type")
        if isinstance(kind, ast.Name) and kind.id == "bool":
            yield Hit(kind)


ARGPARSE_TYPE_BOOL = Rule(
    code="TD801",
    name="argparse-type-bool",
    message="argparse type=bool: any non-empty value, 'False' included, parses as True",
    what="An argparse option declared with type=bool.",
    why=(
        "argparse calls bool() on the string it receives, and bool() of every non-empty "
        "string is True: `--use_amp False` turns AMP on, `--pretrained 0` loads the "
        "pretrained weights. The run silently does the opposite of what was asked, and the "
        "logged command line says otherwise."
    ),
    example='parser.add_argument("--use_amp", type=bool, default=False)',
    fix=(
        'parser.add_argument("--use_amp", action="store_true")\n'
        "# or, for --flag/--no-flag: action=argparse.BooleanOptionalAction"
    ),
    check=_bool_options,
)

RULES = (ARGPARSE_TYPE_BOOL,)
