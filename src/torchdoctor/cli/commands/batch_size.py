"""`torchdoctor batch-size [OPTIONS] [--] COMMAND...`: the largest batch size a training script
runs with, measured by running it: doubling until a try fails, then bisecting.

The command runs once per try, as a subprocess, with `{}` in its arguments replaced by the batch
size (`torchdoctor batch-size -- python train.py --batch-size {} --steps 2`), or with the value
of `--arg FLAG` set (`--arg --batch-size`: replaces the flag's value, or appends the flag). A
try fails when the script exits non-zero with an out-of-memory error in its stderr, or is
killed (the kernel's OOM killer, or --try-timeout); any other failure stops the search
(under --limit-memory, only after the same size failed again with twice the allowance: a
native library that cannot allocate may say so in its own words).

On CPU, `--limit-memory SIZE` caps each try's address space (RLIMIT_AS) at SIZE above what a
Python process with torch imported takes, so running out is a real, catchable allocation error
rather than the OOM killer. (Not for CUDA runs: the driver reserves far more address space than
it uses.) Under the cap the tries run with glibc's mmap threshold fixed
(MALLOC_MMAP_THRESHOLD_=131072): its dynamic adjustment otherwise moves a run's peak by up to a
megabyte from one run to the next, enough to flip the answer at the boundary. Each try's peak
resident memory comes from the kernel (wait4), and memory per sample is the slope of peak
against batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context

NAME = "batch-size"
SUMMARY = "the largest batch size a script runs with, measured (doubling, then bisection)"
TARGET = "none"
FORMATS = formats.REPORT

PLACEHOLDER = "{}"
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
_VALUED = {"--start", "--max", "--arg", "--limit-memory", "--try-timeout", "--format"}
_SWITCHES = {"-h", "--help", "--show-output"}
_BASELINE_CODE = (
    "import torch\n"
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('VmPeak:'):\n"
    "        print(int(line.split()[1]) * 1024)\n"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start", type=int, default=1, help="first batch size tried (1)")
    parser.add_argument("--max", type=int, dest="limit", help="largest batch size tried")
    parser.add_argument(
        "--arg", metavar="FLAG", help="the script's batch-size flag (instead of {} in COMMAND)"
    )
    parser.add_argument(
        "--limit-memory",
        metavar="SIZE",
        help="CPU: cap each try at SIZE (e.g. 2GiB, 500M) above a Python with torch imported",
    )
    parser.add_argument(
        "--try-timeout", type=float, metavar="SECONDS", help="a try running longer fails"
    )
    parser.add_argument("--show-output", action="store_true", help="let the tries print")
    parser.add_argument("command", nargs="*", help="the training command")


def parse_argv(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    if "--" in argv:
        cut = argv.index("--")
        ours, theirs = argv[:cut], argv[cut + 1 :]
    else:
        i = 0
        while i < len(argv):
            key = argv[i].partition("=")[0]
            if key in _VALUED:
                i += 1 if "=" in argv[i] else 2
            elif argv[i] in _SWITCHES:
                i += 1
            elif argv[i].startswith("-"):
                raise CliError(f"batch-size: unknown option {argv[i]!r} (options go first)")
            else:
                break
        ours, theirs = argv[:i], argv[i:]
    args = parser.parse_args(ours)
    args.command = theirs
    return args


def command_for(template: list[str], size: int, flag: str | None) -> list[str]:
    """The command of one try: `{}` replaced, or FLAG's value set."""
    if any(PLACEHOLDER in part for part in template):
        return [part.replace(PLACEHOLDER, str(size)) for part in template]
    if flag is None:
        raise CliError("batch-size: put {} where the batch size goes, or name it with --arg FLAG")
    out = list(template)
    for i, part in enumerate(out):
        if part == flag and i + 1 < len(out):
            out[i + 1] = str(size)
            return out
        if part.startswith(flag + "="):
            out[i] = f"{flag}={size}"
            return out
    return [*out, flag, str(size)]


def _interpreter(command: list[str]) -> str:
    first = os.path.basename(command[0])
    return command[0] if first.startswith("python") else sys.executable


def baseline(command: list[str], env: dict[str, str] | None = None) -> int:
    """Address space of a Python process that imported torch (VmPeak)."""
    out = subprocess.run(
        [_interpreter(command), "-c", _BASELINE_CODE],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise CliError(f"batch-size: cannot measure the baseline: {out.stderr.strip()}") from None


def run_try(
    command: list[str],
    cap: int | None,
    timeout: float | None,
    show: bool,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one try; its outcome: ok, reason, peak RSS, seconds, exit code, stderr tail."""
    from torchdoctor.errors.oom_message import is_oom_text

    def limit() -> None:
        if cap is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    sink = None if show else subprocess.DEVNULL
    with tempfile.TemporaryFile(mode="w+b") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(command, stdout=sink, stderr=err, preexec_fn=limit, env=env)
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            try:
                proc.kill()
            except OSError:
                pass

        timer = threading.Timer(timeout, expire) if timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer is not None:
                timer.cancel()
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        seconds = time.monotonic() - t0
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if show and stderr:
        sys.stderr.write(stderr)
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    outcome: dict[str, Any] = {
        "ok": code == 0,
        "exit_code": code,
        "peak_rss": int(usage.ru_maxrss) * 1024,
        "seconds": round(seconds, 3),
        "reason": None,
        "kind": "ok",
    }
    if code == 0:
        return outcome
    if timed_out.is_set():
        outcome.update(reason=f"timed out after {timeout:g} s", kind="timeout")
    elif code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        outcome.update(reason=f"killed by {name} (the kernel's OOM killer?)", kind="killed")
    elif is_oom_text(stderr, limited=cap is not None):
        outcome.update(reason=tail[:200] or "out of memory", kind="oom")
    else:
        outcome.update(reason=tail[:300] or f"exit code {code}", kind="error")
        outcome["stderr"] = stderr[-4000:]
    return outcome


class _Stop(Exception):
    def __init__(self, size: int, outcome: dict[str, Any]) -> None:
        super().__init__(outcome.get("reason"))
        self.size = size
        self.outcome = outcome


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.memory.batch_size import fit_line, search
    from torchdoctor.units import human, parse_size

    if not args.command:
        raise CliError("batch-size: give the training command (after --)")
    if args.start < 1 or (args.limit is not None and args.limit < args.start):
        raise CliError("batch-size: need 1 <= --start <= --max")
    template = list(args.command)
    if template[0].endswith(".py"):
        template = [sys.executable, *template]
    command_for(template, args.start, args.arg)  # fails early without {} or --arg
    cap = None
    base = None
    extra_env: dict[str, str] = {}
    if args.limit_memory:
        try:
            size = parse_size(args.limit_memory)
        except ValueError as exc:
            raise CliError(f"batch-size: --limit-memory: {exc}") from None
        extra_env = dict(STEADY_MALLOC)
        base = baseline(template, dict(os.environ, **extra_env))
        cap = base + size
        ctx.warn(
            f"torchdoctor batch-size: each try may use {human(size)} of address space above "
            f"the {human(base)} of a Python with torch imported"
        )
    tries: list[dict[str, Any]] = []

    def attempt(batch: int) -> bool:
        command = command_for(template, batch, args.arg)
        env = dict(os.environ, **extra_env)
        outcome = run_try(command, cap, args.try_timeout, args.show_output, env)
        outcome["batch_size"] = batch
        tries.append(outcome)
        show(batch, outcome)
        if outcome["kind"] == "error" and cap is not None and base is not None:
            # Under the cap a failed allocation inside a native library can surface as its own
            # error (oneDNN: "could not create a primitive"); the same size with twice the
            # allowance tells a memory failure from a real one.
            roomier = base + 2 * (cap - base)
            check = run_try(command, roomier, args.try_timeout, False, env)
            show(batch, check, f"(again, with {human(roomier - base)} above the baseline)")
            outcome["recheck"] = {k: check[k] for k in ("ok", "kind", "peak_rss", "seconds")}
            if check["ok"] or check["kind"] == "oom":
                outcome.update(kind="oom", reason=f"under the limit only: {outcome['reason']}")
                outcome.pop("stderr", None)
        if outcome["kind"] == "error":
            raise _Stop(batch, outcome)
        return bool(outcome["ok"])

    def show(batch: int, outcome: dict[str, Any], note: str = "") -> None:
        state = "ok" if outcome["ok"] else outcome["kind"]
        detail = "" if outcome["ok"] else f"  {outcome['reason']}"
        ctx.warn(
            f"  batch size {batch:>6}: {state:<7} peak RSS {human(outcome['peak_rss']):>11}"
            f"  {outcome['seconds']:6.1f} s{detail}{'  ' + note if note else ''}"
        )

    try:
        good, bad = search(attempt, args.start, args.limit)
    except _Stop as stop:
        ctx.warn(
            f"torchdoctor: batch-size: the script failed at batch size {stop.size} for a reason "
            f"other than memory (exit code {stop.outcome['exit_code']}):"
        )
        ctx.warn(stop.outcome.get("stderr", "").rstrip())
        return TARGET_ERROR
    slope, intercept = fit_line([(t["batch_size"], t["peak_rss"]) for t in tries if t["ok"]])
    result = {
        "command": template,
        "max_batch_size": good,
        "first_failure": bad,
        "limit_reached": bad is None,
        "memory_per_sample": slope,
        "base_memory": intercept,
        "limit_memory": (cap - base) if cap is not None and base is not None else None,
        "baseline": base,
        "env": extra_env,
        "tries": tries,
    }
    if args.format == "json":
        ctx.print(json.dumps(result, indent=2))
        return OK
    if good == 0:
        ctx.print(f"no batch size fits: even {bad} failed")
        return OK
    line = f"largest batch size that fits: {good}"
    if bad is not None:
        line += f" ({bad} failed)"
    else:
        line += " (the --max; larger sizes were not tried)"
    ctx.print(line)
    if slope:
        ctx.print(f"memory per sample: ≈ {human(slope)} (slope of peak RSS over the tries)")
    return OK
