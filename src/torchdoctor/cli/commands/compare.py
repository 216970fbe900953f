"""`torchdoctor compare RUN_A RUN_B` (run or job directories, or a live endpoint for either), or
`torchdoctor ENDPOINT compare RUN_A` (the live process against a saved baseline): what changed
from A to B. Step time and each phase with a bootstrap interval of the median ratio (real or
noise), the modules that got slower or faster, memory, ranks and collectives of a job, the
first step where the loss differs, how they were run; one headline. `--fail-if slower:5%`
(loss:..., memory:...) makes it a CI gate: exit 1 when a limit is exceeded."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchdoctor._json import dumps
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "compare"
SUMMARY = "what changed between two runs: slower phase or module, memory, loss, settings"
TARGET = "optional"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="A (the baseline) and B: run or job directories, or a pid, socket or HOST:PORT "
        "of a live process; with an ENDPOINT before the verb, only A",
    )
    parser.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="LIMIT",
        help="exit 1 when B is worse than A by more than this: slower:5%%, loss:2%%, "
        "loss:identical, memory:10%% (or slower:20ms, memory:512MiB); repeat or separate "
        "with commas",
    )
    parser.add_argument(
        "--noise-floor",
        default="10%",
        metavar="PCT",
        help="the least change of a time ever called real (default 10%%: two runs of the same "
        "code on a shared machine differ by that much; 5%% suits a quiet, dedicated one)",
    )


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cli.run_source import SourceError, live, open_source
    from torchdoctor.compare.build import compare
    from torchdoctor.compare.gate import GateError, parse

    try:
        gates = [g for spec in args.fail_if for g in parse(spec)]
    except GateError as exc:
        raise CliError(str(exc)) from None
    noise = _percentage(args.noise_floor)
    runs = list(args.runs)
    if ctx.endpoint is not None:
        if len(runs) != 1:
            raise CliError("compare: with an ENDPOINT, give one saved run to compare it with")
    elif len(runs) != 2:
        raise CliError("compare: give two runs, A (the baseline) and B")
    try:
        a = facts(open_source(runs[0], ctx))
        b = facts(
            live(ctx.client(), ctx) if ctx.endpoint is not None else open_source(runs[1], ctx)
        )
    except SourceError as exc:
        ctx.warn(f"torchdoctor: compare: {exc}")
        return TARGET_ERROR
    record = compare(a, b, gates, noise)
    if args.format == "json":
        ctx.print(dumps(record, indent=2))
    else:
        from torchdoctor.report.compare import render_compare

        ctx.print(render_compare(record))
    return TARGET_ERROR if record.failed else OK


def facts(source: Any) -> Any:
    """The comparison's facts of a run opened by cli/run_source.py."""
    from torchdoctor.compare.facts import collect, step_block_columns
    from torchdoctor.store.saved import RunNotFound

    try:
        steps = None if source.live else step_block_columns(source.run.block("steps"))
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    return collect(source.execute, source.meta, source.label, source.run_dir, steps, source.live)


def _percentage(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%")) / 100
    except ValueError:
        value = -1.0
    if not 0 <= value < 10:
        raise CliError(f"compare: --noise-floor expects a percentage such as 5%, got {text!r}")
    return value
