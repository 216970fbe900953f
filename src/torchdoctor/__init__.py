"""torchdoctor: finds out why a PyTorch training run is broken, slow or stuck.

Public API (everything else is private):

    with torchdoctor.Session(run_dir, **options) as s: ...
                                      record a block of code; everything it installs is
                                      removed on exit (one session at a time, any number
                                      one after another: what tests use)
    torchdoctor.start(**options)      start the probe in this process (idempotent)
    torchdoctor.stop()                stop it, saving what was recorded
    torchdoctor.watch(model, optimizer=None, name=None)
                                      name a model (and optimizer) explicitly
    torchdoctor.step(loss=None)       mark the end of a step in loops without torch.optim
    torchdoctor.configure(**changes)  change trace_every / guard / hang_timeout on a live run
    torchdoctor.explain(error)        an exception or an error text -> what it means, what to do
    torchdoctor.find_max_batch_size(step_fn, ...)
                                      the largest batch size that fits, measured
"""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor._version import __version__
from torchdoctor.config import Config

__all__ = [
    "Config",
    "Session",
    "__version__",
    "configure",
    "explain",
    "find_max_batch_size",
    "start",
    "step",
    "stop",
    "watch",
]


def __getattr__(name: str) -> Any:
    if name == "Session":  # the session module loads the probe's parts: only when asked
        from torchdoctor.session import Session

        return Session
    raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")


def start(config: Config | None = None, **options: Any) -> Any:
    """Start the probe here. Options: run_dir, listen, token, hang_timeout, trace_every, guard,
    quiet (the same as the command-line flags and TORCHDOCTOR_* variables)."""
    from torchdoctor import session

    started = session.start(config, **options)
    if "IPython" in sys.modules:  # a notebook waits for its user between cells: no hang
        from torchdoctor.integrations.notebook import current_shell, watch_cells

        watch_cells(current_shell())
    return started


def stop() -> None:
    """Stop the probe: remove every hook, save the tables, close the endpoint."""
    from torchdoctor import session

    current = session.current()
    if current is not None:
        current.stop()


def _recorder(start_if_needed: bool = True) -> Any:
    from torchdoctor import session

    current = session.current() or (session.start() if start_if_needed else None)
    return current.ensure_telemetry() if current is not None else None


def watch(model: Any, optimizer: Any = None, name: str | None = None) -> None:
    """Name a model (and its optimizer) explicitly; starts the probe if needed."""
    recorder = _recorder()
    if recorder is not None:
        recorder.watch(model, optimizer, name)


def step(loss: Any = None) -> None:
    """End a training step, for loops that update weights without torch.optim."""
    recorder = _recorder()
    if recorder is not None:
        recorder.manual_step(loss)


def configure(**changes: Any) -> dict[str, Any]:
    """Change trace_every, guard, hang_timeout or alerts of the running probe."""
    from torchdoctor import session

    current = session.current()
    if current is None:
        raise RuntimeError("torchdoctor is not running in this process")
    return current.configure(**changes)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchdoctor`: start the probe and add `%torchdoctor status|diagnoses|query|
    report` (see torchdoctor.integrations.notebook)."""
    from torchdoctor.integrations.notebook import load_ipython_extension as load

    load(ipython)


def explain(error: BaseException | str, here: bool | None = None) -> Any:
    """Explain an exception, or the text of an error message, traceback or log. Returns an
    Explanation (category, summary, meaning, fields, ranked causes, first steps, fixes;
    .to_dict() for JSON); print() it for the same report as `torchdoctor explain`. `here`:
    use this machine (versions, GPUs, driver, the files named) as evidence; by default for an
    exception, which was raised in this process, not for a text."""
    from torchdoctor.errors.api import explain as _explain
    from torchdoctor.report.explanation import printable

    if here is None:
        here = isinstance(error, BaseException)
    if here:
        from torchdoctor.evidence import explain_here

        return printable(explain_here(error))
    return printable(_explain(error))


def find_max_batch_size(
    step_fn: Any,
    start: int = 1,
    limit: int | None = None,
    device: Any = None,
    max_memory: int | None = None,
    **options: Any,
) -> Any:
    """The largest batch size for which `step_fn(batch_size)` (one full training step) runs
    without running out of memory: doubling, then bisection, cleaning up between tries.
    Returns a BatchSizeResult (max_batch_size, memory_per_sample, tries, ...). Options: model,
    optimizer, cleanup, warmup, progress; see torchdoctor.memory.batch_size."""
    from torchdoctor.memory.batch_size import find_max_batch_size as _find

    return _find(step_fn, start, limit, device, max_memory, **options)
