"""`torchdoctor run [OPTIONS] SCRIPT ARGS...` or `run [OPTIONS] -m MODULE ARGS...`.

The probe starts first; then the script runs in this process exactly as `python SCRIPT ARGS`
would. torchdoctor's options come before the script; everything after it is the script's.
The exit code is the script's own.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import CliError
from torchdoctor.cli.script import split_options

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "run"
SUMMARY = "run a training script (or -m module) with the probe and telemetry on"
TARGET = "none"

_VALUED = {"--run-dir", "--listen", "--token", "--hang-timeout", "--trace-every", "--metrics", "-m"}
_SWITCHES = {"--guard", "--metrics-open", "--quiet", "-q", "-h", "--help"}


def configure(parser: argparse.ArgumentParser) -> None:
    from torchdoctor.config import add_arguments

    add_arguments(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no status line, no summary")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """torchdoctor's options, and the script with its arguments (never parsed by us)."""
    return split_options(argv, _VALUED, _SWITCHES, NAME)


def parse_argv(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    ours, theirs = split_argv(argv)
    args = parser.parse_args(ours)
    if args.module is None:
        if not theirs:
            raise CliError("run: give a script (torchdoctor run train.py ARGS...) or -m MODULE")
        args.script, args.args = theirs[0], theirs[1:]
    else:
        args.script, args.args = None, theirs
    return args


def _explain(exc: BaseException, probe: Any) -> None:
    """After the traceback, once (no alert before it; the summary refers to it): what the error
    means and what to do, for this run when the capture has it (the module that raised, the
    shapes that flowed into it; an out-of-memory's measured fixes), else from the catalog."""
    diagnosis = probe.crash_diagnosis
    if probe.crash_evidence is not None:
        from torchdoctor.report.crash import render_crash

        probe.say(render_crash(probe.crash_evidence), diagnosis)
        return
    if diagnosis is not None:  # an out-of-memory, with its numbers
        from torchdoctor.report.alerts import render_alert

        probe.say(render_alert(diagnosis, fixes=len(diagnosis.fix)), diagnosis)
        return
    try:
        from torchdoctor.errors.api import explain_exception
        from torchdoctor.report.explanation import render_text
    except ImportError:
        return
    try:
        explanation = explain_exception(exc)
        if explanation.recognised:
            probe.say(render_text(explanation, brief=True))
    except Exception as err:
        probe.say(f"torchdoctor: could not explain the error: {err}")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor import session
    from torchdoctor.cli import script
    from torchdoctor.config import ConfigError, from_args

    try:
        config = from_args(args)
    except ConfigError as exc:
        raise CliError(f"run: {exc}") from None
    if args.script is not None and not os.path.exists(args.script):
        raise CliError(f"run: can't open file {args.script!r}: No such file or directory")
    # What `list` shows of this process: the script and its arguments (run_script sets the
    # same again, as python does)
    sys.argv = [args.script, *args.args] if args.module is None else ["-m", args.module, *args.args]
    probe = session.start(config)
    probe.explains_crash = True  # after the traceback (_explain), not as an alert before it
    status = None
    if not config.quiet:
        ctx.warn(f"torchdoctor: probing pid {probe.pid}; run directory {probe.run_dir}")
        if sys.stderr.isatty():
            from torchdoctor.cli.status import StatusLine

            status = StatusLine(probe).start()
    if args.module is not None:
        outcome = script.run_module(args.module, args.args)
    else:
        outcome = script.run_script(args.script, args.args)
    if status is not None:
        status.stop()
    if outcome.exception is not None and not outcome.interrupted:
        probe.report_crash(outcome.exception)
        if not config.quiet:
            _explain(outcome.exception, probe)
    if outcome.interrupted:
        probe.note_signal(signal.SIGINT)
    probe.stop(outcome.code)
    if not config.quiet:
        from torchdoctor.report.summary import render_summary

        ctx.warn(render_summary(probe.summary()))
    sys.stdout.flush()
    if outcome.interrupted:
        # End as an interrupted Python ends: killed by SIGINT, so shells see 130.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return outcome.code
