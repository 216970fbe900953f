"""`torchdoctor attach PID`: start the probe in a process started without it."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import OK, CliError

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "attach"
SUMMARY = "start the probe inside a running Python process (gdb, or sys.remote_exec)"
TARGET = "none"


def configure(parser: argparse.ArgumentParser) -> None:
    from torchdoctor.config import add_arguments

    parser.add_argument("pid", type=int, help="the process to attach to")
    add_arguments(parser)
    parser.add_argument(
        "--wait", type=float, default=60.0, metavar="SECONDS", help="how long to wait for it"
    )
    parser.add_argument(
        "--safe-wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for a safe point before attaching directly (default 5)",
    )


def _await_probe(pid: int, seconds: float) -> dict[str, Any] | None:
    """The target's registry entry once its probe is up (an external process: poll)."""
    from torchdoctor import registry

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        entry = registry.find(pid)
        if entry is not None:
            return entry
        if not registry.alive(pid):
            raise CliError(f"process {pid} exited while attaching")
        time.sleep(0.05)
    return None


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor import registry
    from torchdoctor.attach import AttachError, bootstrap_code, inject

    pid = args.pid
    if not registry.alive(pid):
        raise CliError(f"no process with pid {pid}")
    if registry.find(pid) is not None:
        ctx.print(f"process {pid} is already probed: torchdoctor {pid} backtrace")
        return OK
    options = {
        name: getattr(args, name)
        for name in (
            *("run_dir", "listen", "token", "hang_timeout", "trace_every", "guard"),
            *("metrics", "metrics_open"),
        )
        if getattr(args, name, None) is not None
    }
    code = bootstrap_code(options)
    try:
        inject(pid, code, timeout=args.wait)
        entry = _await_probe(pid, min(args.safe_wait, args.wait))
        if entry is None:
            # The main thread never reached a safe point: it is stuck in C (a hang, a long
            # kernel). Run the start-up code from the stopped thread instead.
            ctx.warn(f"torchdoctor: process {pid} is busy in native code; attaching directly")
            inject(pid, code, direct=True, timeout=args.wait)
            entry = _await_probe(pid, args.wait)
    except AttachError as exc:
        raise CliError(f"attach: {exc}") from None
    if entry is not None:
        ctx.print(f"attached to {pid}: endpoint {entry['socket']}; run dir {entry['run_dir']}")
        ctx.print(
            "steps are counted from the attach: step 0 is the first one after it; the steps "
            "the process took before were not seen"
        )
        ctx.print(f"try: torchdoctor {pid} backtrace")
        return OK
    raise CliError(
        f"attach: the probe did not come up in process {pid} within {args.wait:g} s "
        "(is its main thread holding the GIL in a long C call?)"
    )
