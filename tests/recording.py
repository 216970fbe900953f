"""Recording a training script in the test's own process, as memray's tests track in-process:
`record(script, *args, run_dir=...)` runs the script as `torchdoctor run` would (its own
`__main__`, argv and sys.path[0], through torchdoctor's runner) inside a
`torchdoctor.Session`, then puts back what a script may change in the process (see
`process_state`), so that the next test starts as this one did. The run directory is then
judged like any saved run: `query(run_dir, sql)` reads its tables as `torchdoctor query
RUN_DIR SQL --format json` prints them, and `td(VERB, ...)` runs any verb of the CLI
(`run`, `report`, `export`, `shapes`, `overfit`, ...) through its `main()` in this process,
its stdout and stderr captured, as `helpers.cli` runs it in a subprocess.

A test needs a separate process only when the process is what is tested (its exit, its
signals, its stdout byte for byte, a stuck process questioned live, several ranks).

What cannot be captured here: output written to file descriptors 1 and 2 directly (C code, a
child process that inherits them); a DataLoader worker's prints do come back (it writes to
the same file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers import ROOT, SCRIPTS

# Signals whose handlers a script (or a session that failed to clean up) may change.
_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


@dataclasses.dataclass
class Recorded:
    run_dir: Path | None  # None: a script run by execute() that started no session
    code: int  # what the process would have exited with
    session: Any  # the torchdoctor.Session, stopped: summary(), diagnoses()
    exception: BaseException | None
    stdout: str = ""  # what the script (and torchdoctor) printed
    stderr: str = ""

    def diagnoses(self) -> list[dict[str, Any]]:
        """The findings as saved (diagnoses.jsonl), the latest report of each last."""
        assert self.run_dir is not None, "no session recorded this script"
        return saved_diagnoses(self.run_dir)

    def output(self) -> str:
        return f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@dataclasses.dataclass
class Output:
    """What a CLI call printed and returned, as subprocess.CompletedProcess has it."""

    returncode: int
    stdout: str
    stderr: str


def saved_diagnoses(run_dir: Path) -> list[dict[str, Any]]:
    """diagnoses.jsonl of a run directory, in order ([] when nothing was found)."""
    path = Path(run_dir) / "diagnoses.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Captured:
    """The text written to sys.stdout and sys.stderr while captured (read once it ended)."""

    stdout = ""
    stderr = ""


@contextlib.contextmanager
def captured() -> Iterator[Captured]:
    """sys.stdout and sys.stderr go to files (real ones: a script may ask for their fileno()),
    and so do the logging handlers that write to the streams these replace (torch's and
    transformers' loggers make their handlers at import, on the stderr of that moment);
    handlers made meanwhile on the captured streams get the real ones back at the end (and a
    flush bound to a captured stream, as transformers binds its handler's, the real one's)."""
    result = Captured()
    old = {"out": sys.stdout, "err": sys.stderr}
    files = {
        key: tempfile.TemporaryFile("w+", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        for key in old
    }
    moved: dict[logging.StreamHandler[Any], Any] = {}
    for handler in _stream_handlers():
        if handler.stream in (old["err"], sys.__stderr__):
            moved[handler] = handler.stream
            handler.stream = files["err"]
        elif handler.stream in (old["out"], sys.__stdout__):
            moved[handler] = handler.stream
            handler.stream = files["out"]
    sys.stdout, sys.stderr = files["out"], files["err"]
    try:
        yield result
    finally:
        for f in files.values():
            with contextlib.suppress(Exception):
                f.flush()
        sys.stdout, sys.stderr = old["out"], old["err"]
        for handler in _stream_handlers():
            for key, f in files.items():
                if handler.stream is f:
                    handler.stream = moved.get(handler, old[key])
                # transformers binds its handler's flush to the stderr of its import
                flush = handler.__dict__.get("flush")
                if getattr(flush, "__self__", None) is f:
                    handler.flush = old[key].flush  # type: ignore[method-assign]
        texts = {}
        for key, f in files.items():
            f.seek(0)
            texts[key] = f.read()
            f.close()
        result.stdout, result.stderr = texts["out"], texts["err"]


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    known = logging.Logger.manager.loggerDict.values()
    loggers = [logging.getLogger(), *(x for x in known if isinstance(x, logging.Logger))]
    found = []
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                found.append(handler)
    return found


@dataclasses.dataclass
class _LoggerState:
    level: int
    handlers: list[logging.Handler]
    filters: list[Any]
    propagate: bool
    disabled: bool


def _logging_state() -> tuple[int, dict[str, _LoggerState]]:
    state = {}
    named: dict[str, Any] = {"": logging.getLogger()}
    named.update(logging.Logger.manager.loggerDict)
    for name, logger in named.items():
        if isinstance(logger, logging.Logger):
            state[name] = _LoggerState(
                logger.level,
                list(logger.handlers),
                list(logger.filters),
                logger.propagate,
                logger.disabled,
            )
    return logging.root.manager.disable, state


def _restore_logging(saved: tuple[int, dict[str, _LoggerState]]) -> None:
    disable, state = saved
    logging.disable(disable)
    # Loggers made during the run (a library imported by the script) keep what they were given
    # at import: the library stays imported, and a new process would set them up the same way.
    for name, was in state.items():
        logger = logging.getLogger(name or None)
        logger.setLevel(was.level)
        logger.handlers[:] = was.handlers
        logger.filters[:] = was.filters
        logger.propagate = was.propagate
        logger.disabled = was.disabled


def _torch_state() -> tuple[Any, ...]:
    import torch

    return (
        torch.get_num_threads(),
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_rng_state(),
        torch.is_anomaly_enabled(),
        torch.is_anomaly_check_nan_enabled(),
        torch.get_float32_matmul_precision(),
        torch.get_default_device(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
        dict(vars(torch._tensor_str.PRINT_OPTS)),  # torch.set_printoptions
    )


def _restore_torch(saved: tuple[Any, ...]) -> None:
    import torch

    (
        threads,
        dtype,
        grad,
        deterministic,
        warn_only,
        rng,
        anomaly,
        anomaly_nan,
        precision,
        device,
        benchmark,
        cudnn_deterministic,
        cudnn_tf32,
        matmul_tf32,
        print_opts,
    ) = saved
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.set_rng_state(rng)
    torch.set_anomaly_enabled(anomaly, anomaly_nan)
    torch.set_float32_matmul_precision(precision)
    torch.set_default_device(None if device == torch.device("cpu") else device)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    for name, value in print_opts.items():
        setattr(torch._tensor_str.PRINT_OPTS, name, value)


def _fresh_dynamo() -> None:
    """torch.compile's caches and counters as a new process has them (what torch's own
    test case does between tests), when Dynamo is loaded."""
    if "torch._dynamo" not in sys.modules:
        return
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.clear_compilation_metrics()


@contextlib.contextmanager
def process_state(cwd: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run in `cwd` with `env` added to the environment, then restore what a training script
    may change in the process: the working directory, the environment, argv, sys.path,
    `__main__`, the modules it imported from its own directories, the standard streams, the
    signal handlers, sys.excepthook and threading.excepthook, warnings filters, the logging
    configuration, torch's global settings and torch.compile's caches, NumPy's error state,
    the random generators, the garbage collector's settings."""
    import numpy as np

    saved_main = sys.modules.get("__main__")
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    saved_cwd = os.getcwd()
    saved_environ = dict(os.environ)
    saved_modules = set(sys.modules)
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    saved_trace = (sys.gettrace(), sys.getprofile())
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_warnings = warnings.catch_warnings()
    saved_warnings.__enter__()
    saved_logging = _logging_state()
    saved_torch = _torch_state()
    saved_numpy = np.geterr()
    saved_random = (random.getstate(), np.random.get_state())
    saved_gc = (_gc_enabled(), _gc_threshold())
    os.chdir(cwd)
    os.environ.update(env or {})
    _startup_warnings()
    _fresh_dynamo()
    import torch

    torch.set_num_threads(1)  # as the subprocesses' OMP_NUM_THREADS=1: workers share 2 cores
    # the generators as a new process has them: seeded from the system's entropy
    torch.seed()
    random.seed()
    np.random.seed()
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.excepthook, threading.excepthook, sys.unraisablehook = saved_hooks
        sys.settrace(saved_trace[0])
        sys.setprofile(saved_trace[1])
        for signum, handler in saved_signals.items():
            if handler is not None and signal.getsignal(signum) is not handler:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(signum, handler)
        saved_warnings.__exit__(None, None, None)
        _restore_logging(saved_logging)
        # modules the script imported from its own directory (tests/scripts helpers, a
        # package in the test's directory) are loaded again by the next script, as a new
        # process would
        homes = (str(SCRIPTS), *_test_dirs(cwd))
        for name in set(sys.modules) - saved_modules:
            module = sys.modules.get(name)
            if str(getattr(module, "__file__", "") or "").startswith(homes):
                del sys.modules[name]
        _restore_torch(saved_torch)
        _fresh_dynamo()
        np.seterr(**saved_numpy)
        random.setstate(saved_random[0])
        np.random.set_state(saved_random[1])
        _restore_gc(saved_gc)


# Python's own warning filters at start-up (without -W or PYTHONWARNINGS)
_STARTUP_FILTERS = [
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
]


def _startup_warnings() -> None:
    """Warnings filtered and printed to sys.stderr as in a new interpreter (pytest records
    the warnings of a test instead of printing them)."""
    warnings.resetwarnings()
    for action, message, category, module, lineno in reversed(_STARTUP_FILTERS):
        warnings.filterwarnings(action, message or "", category, module or "", lineno)

    def show(message: warnings.WarningMessage) -> None:
        text = warnings.formatwarning(
            message.message, message.category, message.filename, message.lineno, message.line
        )
        (message.file or sys.stderr).write(text)

    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    warnings._showwarnmsg_impl = show  # type: ignore[attr-defined]


def _test_dirs(cwd: Path) -> list[str]:
    """`cwd` when it is a test's own directory (a package a test wrote there), not one that
    holds the project or its virtual environment."""
    here = Path(cwd).resolve()
    for kept in (ROOT, Path(sys.prefix).resolve()):
        if kept == here or here in kept.parents:
            return []
    return [str(cwd), str(here)]


def _gc_enabled() -> bool:
    import gc

    return gc.isenabled()


def _gc_threshold() -> tuple[int, ...]:
    import gc

    return gc.get_threshold()


def _restore_gc(saved: tuple[bool, tuple[int, ...]]) -> None:
    import gc

    enabled, threshold = saved
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def execute(
    script: str | Path,
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> Recorded:
    """Run tests/scripts/`script` (or a path) with `args` in this process as `python SCRIPT
    ARGS` would, in `cwd`, with `env` added to the environment: for scripts that start and stop
    torchdoctor themselves (torchdoctor.start(), a framework's callback). A session the script
    left running for the interpreter's exit (atexit) is stopped when it ends, as at that exit;
    Recorded.run_dir is its run directory (None when the script started none)."""
    from torchdoctor import session as sessions
    from torchdoctor.cli.script import run_script

    path = Path(script) if os.path.isabs(script) else SCRIPTS / script
    cwd.mkdir(parents=True, exist_ok=True)
    with process_state(cwd, env), captured() as out:
        outcome = run_script(str(path), list(args))
        left = sessions.current()
        if left is not None:
            left.stop(outcome.code)
    run_dir = Path(left.run_dir) if left is not None else None
    return Recorded(run_dir, outcome.code, left, outcome.exception, out.stdout, out.stderr)


def record(
    script: str | Path,
    *args: str,
    run_dir: Path | None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    **options: Any,
) -> Recorded:
    """Run tests/scripts/`script` (or a path) with `args` under a Session recording into
    `run_dir` (None: the default directory under `cwd`), in `cwd` (default: the run
    directory's parent) with `env` added to the environment; `options` are the Session's
    (guard=True, hang_timeout=2, trace_every=1, quiet=False for its alerts on stderr, ...).
    What the script and the session print is captured (Recorded.stdout, .stderr)."""
    import torchdoctor
    from torchdoctor.cli.script import run_script

    path = Path(script) if os.path.isabs(script) else SCRIPTS / script
    cwd = cwd or (run_dir.parent if run_dir is not None else None)
    assert cwd is not None, "record(): give run_dir or cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    options.setdefault("quiet", True)
    with (
        process_state(cwd, env),
        captured() as out,
        torchdoctor.Session(run_dir, **options) as session,
    ):
        outcome = run_script(str(path), list(args))
        session.exit_code = outcome.code
        if outcome.exception is not None:
            session.report_crash(outcome.exception)
    return Recorded(
        Path(session.run_dir), outcome.code, session, outcome.exception, out.stdout, out.stderr
    )


def td(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
       stdin: str | None = None) -> Output:  # fmt: skip
    """`torchdoctor ARGS` through the CLI's main() in this process, in `cwd` with `env` added
    to the environment: its exit code, stdout and stderr. `td("run", ...)` is `torchdoctor run`
    itself (the summary, the crash explanation), the process restored afterwards as by
    `record`."""
    from torchdoctor.cli.main import main

    cwd = cwd or Path.cwd()
    cwd.mkdir(parents=True, exist_ok=True)
    with process_state(cwd, env), captured() as out:
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        code = main([str(a) for a in args])
    return Output(code, out.stdout, out.stderr)


def query(run_dir: Path | str, sql: str) -> list[dict[str, Any]]:
    """The rows of `sql` over a saved run (or job) directory, as `torchdoctor query RUN_DIR
    SQL --format json` prints them (non-finite floats as "nan", "inf", "-inf")."""
    from torchdoctor.report.tabular import render
    from torchdoctor.sql.engine import SqlEngine
    from torchdoctor.store.saved import open_run

    engine = SqlEngine(open_run(run_dir))
    try:
        result = engine.execute(sql)
    finally:
        engine.close()
    return list(json.loads(render(result.columns, result.rows, "json")))


def recipe(kind: str, steps: int, *target: str | Path, cwd: Path) -> tuple[Any, Output]:
    """The training half of `torchdoctor overfit|repro` in this process: what the verb's child
    process runs (torchdoctor.cli.recipe_run.child: a session, the recipe's mode, the script
    stopped after `steps`), its result (None when it wrote none) and what it printed. The
    verbs themselves, which start that child, are tested end to end in subprocesses."""
    from torchdoctor.cli import recipe_run

    cwd.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="td-recipe-") as tmp:
        out = Path(tmp) / "result.json"
        spec = json.dumps({"kind": kind, "steps": steps, "out": str(out), "dir": tmp})
        with process_state(cwd, {recipe_run.ENV: spec}), captured() as printed:
            code = recipe_run.child([str(t) for t in target])
        result = json.loads(out.read_text()) if out.exists() else None
    return result, Output(code, printed.stdout, printed.stderr)
