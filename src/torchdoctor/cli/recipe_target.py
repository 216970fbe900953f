"""The target of a recipe verb (overfit, repro): torchdoctor's options first, then the script
and its own arguments (or -m MODULE ARGS...); a file that is not a Python script is refused
before a training process is started for it; and why a recipe run has no answer."""

from __future__ import annotations

import argparse
import os
from typing import Any

from torchdoctor.cli.errors import CliError
from torchdoctor.cli.script import split_options

_VALUED = {"--steps", "--format", "-m"}
_SWITCHES = {"-h", "--help"}


def add_target_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    parser.add_argument(
        "--steps", type=int, default=steps, help=f"optimizer steps (default {steps})"
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def parse_target(parser: argparse.ArgumentParser, argv: list[str], verb: str) -> Any:
    """torchdoctor's options first; the script and everything after it are the script's."""
    ours, theirs = split_options(argv, _VALUED, _SWITCHES, verb)
    args = parser.parse_args(ours)
    if args.module is None:
        if not theirs:
            raise CliError(f"{verb}: give a script ({verb} train.py ARGS...) or -m MODULE")
        args.script, args.args = theirs[0], theirs[1:]
        if not os.path.exists(args.script):
            raise CliError(f"{verb}: can't open file {args.script!r}: No such file or directory")
        if os.path.isdir(args.script):
            raise CliError(f"{verb}: {args.script!r} is a directory, not a script")
        _check_compiles(args.script, verb)
    else:
        args.script, args.args = None, theirs
    if args.steps < 1:
        raise CliError(f"{verb}: --steps must be at least 1, got {args.steps}")
    return args


def _check_compiles(path: str, verb: str) -> None:
    """A file that is not Python fails here, before a training process is started for it."""
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise CliError(f"{verb}: {path!r} is not a Python script: {exc.msg}{where}") from None
    except (ValueError, OSError) as exc:  # null bytes, unreadable
        raise CliError(f"{verb}: {path!r} is not a Python script: {exc}") from None


def target_argv(args: argparse.Namespace) -> list[str]:
    if args.module is not None:
        return ["-m", args.module, *args.args]
    return [args.script, *args.args]


def failed_to_run(result: dict[str, Any] | None, code: int, verb: str) -> str | None:
    """Why the recipe has no answer (the script never stepped, crashed first, ...), or None."""
    if result is None:
        return (
            f"{verb}: the script's process ended (exit code {code}) before torchdoctor could "
            f"write its result"
        )
    if result.get("error"):
        return f"{verb}: {result['error']}"
    if int(result.get("steps") or 0) == 0:
        script = result.get("script") or {}
        if script.get("exception"):
            return f"{verb}: the script crashed before its first step ended: {script['exception']}"
        return (
            f"{verb}: the script ended without a training step (exit code "
            f"{script.get('exit_code')}): no optimizer.step() and no backward() was seen. A loop "
            f"without torch.optim marks its steps with torchdoctor.step(loss)"
        )
    return None
