"""`torchdoctor repro [--steps N] [--format json] SCRIPT ARGS...` (or `-m MODULE ARGS...`): the
seeds' reproducibility check, run on the unchanged script. It runs twice for N steps and the
runs are compared step by step (loss, gradient norm, parameters); at the first difference, the
op and module whose output differs; every source of randomness drawn from without a seed, with
its call site; the fix is the missing part of the ritual. Exit 0 when the runs are
bit-identical, 1 when not."""

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

NAME = "repro"
SUMMARY = "run the script twice: are the runs bit-identical, and if not, why?"
TARGET = "none"
FORMATS = formats.REPORT
DEFAULT_STEPS = 20


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, DEFAULT_STEPS)


def parse_argv(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    return parse_target(parser, argv, NAME)


def main(args: argparse.Namespace, ctx: Context) -> int:
    import dataclasses

    from torchdoctor.cli.recipe_run import spawn
    from torchdoctor.recipes.compare import ScriptEnding, compare

    ctx.warn(
        f"torchdoctor repro: running {args.script or '-m ' + args.module} twice, unchanged, for "
        f"{args.steps} steps each; the script's own side effects (checkpoints it saves, logs it "
        f"writes) happen twice"
    )
    runs = []
    for run in (1, 2):
        result, code = spawn(
            {"kind": "repro", "steps": args.steps}, target_argv(args), args.format == "json"
        )
        if code == 130:
            return 130
        problem = failed_to_run(result, code, NAME)
        if problem is not None:
            raise CliError(f"{problem} (run {run})", TARGET_ERROR)
        assert result is not None
        runs.append(result)
    verdict = dataclasses.replace(
        compare(runs[0], runs[1]),
        runs=[r.get("run_dir") for r in runs],
        script=[ScriptEnding.from_json(r.get("script")) for r in runs],
    )
    if args.format == "json":
        ctx.print(dumps(verdict, indent=2))
    else:
        from torchdoctor.report.repro import render_repro

        ctx.print(render_repro(verdict))
    return OK if verdict.identical else TARGET_ERROR
