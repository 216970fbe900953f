"""`torchdoctor overfit [--steps N] [--format json] SCRIPT ARGS...` (or `-m MODULE ARGS...`):
the seeds' first habit, run on the unchanged script. Its first batch is fed again and again for
N optimizer steps; then torchdoctor judges whether the model memorised it (exit 0) or not
(exit 1, with the suspects checked in order and their evidence)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchdoctor._json import dumps
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.cli.recipe_target import (
    add_target_arguments,
    failed_to_run,
    parse_target,
    target_argv,
)
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "overfit"
SUMMARY = "feed the script's first batch again and again: can the model memorise it?"
TARGET = "none"
FORMATS = formats.REPORT
DEFAULT_STEPS = 200


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, DEFAULT_STEPS)


def parse_argv(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    return parse_target(parser, argv, NAME)


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli.recipe_run import spawn

    ctx.warn(
        f"torchdoctor overfit: running {args.script or '-m ' + args.module} unchanged, its "
        f"first batch fed again and again for {args.steps} steps; the script's own side "
        f"effects (checkpoints it saves, logs it writes) still happen"
    )
    result, code = spawn(
        {"kind": "overfit", "steps": args.steps}, target_argv(args), args.format == "json"
    )
    if code == 130:
        return 130
    problem = failed_to_run(result, code, NAME)
    if problem is not None:
        if args.format == "json" and result is not None:
            ctx.print(dumps({**result, "passed": False, "error": problem}, indent=2))
        raise CliError(problem, TARGET_ERROR)
    assert result is not None
    if result.get("no_batch"):
        message = (
            f"{NAME}: no batch could be captured: the first step took its data neither from a "
            f"DataLoader nor as tensors passed to the model or a loss function"
        )
        if args.format == "json":
            ctx.print(dumps({**result, "passed": False, "error": message}, indent=2))
        raise CliError(message, TARGET_ERROR)
    from torchdoctor.recipes.overfit_result import OverfitResult

    read = OverfitResult.from_json(result)
    if args.format == "json":
        ctx.print(dumps(read, indent=2))
    else:
        from torchdoctor.report.overfit import render_overfit

        ctx.print(render_overfit(read))
    return OK if read.passed else TARGET_ERROR
