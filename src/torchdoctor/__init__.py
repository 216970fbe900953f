"""torchdoctor: finds out why a PyTorch training run is broken, slow or stuck.

Public API (everything else is private):

    torchdoctor.start(**options)      start the probe in this process (idempotent)
    torchdoctor.stop()                stop it, saving what was recorded
    torchdoctor.watch(model, optimizer=None, name=None)
                                      name a model (and optimizer) explicitly
    torchdoctor.step(loss=None)       mark the end of a step in loops without torch.optim
    torchdoctor.configure(**changes)  change trace_every / guard / hang_timeout on a live run
"""

from __future__ import annotations

from typing import Any

from torchdoctor._version import __version__
from torchdoctor.config import Config

__all__ = ["Config", "__version__", "configure", "start", "step", "stop", "watch"]


def start(config: Config | None = None, **options: Any) -> Any:
    """Start the probe here. Options: run_dir, listen, token, hang_timeout, trace_every, guard,
    quiet (the same as the command-line flags and TORCHDOCTOR_* variables)."""
    from torchdoctor import session

    return session.start(config, **options)


def stop() -> None:
    """Stop the probe: remove every hook, save the tables, close the endpoint."""
    from torchdoctor import session

    current = session.current()
    if current is not None:
        current.stop()


def _recorder(start_if_needed: bool = True) -> Any:
    from torchdoctor import session

    current = session.current() or (session.start() if start_if_needed else None)
    if current is None:
        return None
    if current.telemetry is None:
        current._on_torch(None)  # torch is imported by whoever holds a model
    return current.telemetry


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
