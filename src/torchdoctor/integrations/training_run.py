"""What every trainer callback does, whatever the framework: start the probe with its run
directory under the trainer's own directory (unless a probe already runs here: then that one,
and its run directory), name the model and optimizer, pick up diagnoses as they are found, and
at the end save everything and write the HTML report.

Nothing here may break the training: every step is guarded, and a failure is one warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchdoctor import session as sessions
from torchdoctor._failsafe import warn_once
from torchdoctor.integrations.report import write_report
from torchdoctor.store import rundir

RUNS_DIR = rundir.DEFAULT_PARENT  # <trainer dir>/torchdoctor-runs/<date>-<host>-<pid>/
SEVERITY_LEVEL = {"info": 1, "warning": 2, "error": 3}  # for loggers that take numbers only


def run_dir_under(base: str | os.PathLike[str]) -> Path:
    """A new run directory under the trainer's directory, named as the default one is."""
    return rundir.default_path(Path(base) / RUNS_DIR)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer): the one whose step hooks fire."""
    seen = 0
    while seen < 8:
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            return optimizer
        optimizer, seen = inner, seen + 1
    return optimizer


class TrainingRun:
    """One training of one trainer, as torchdoctor follows it."""

    def __init__(self, report: bool = True, options: dict[str, Any] | None = None) -> None:
        self.report = report
        self.options = dict(options or {})
        self.session: Any = None
        self.owned = False  # we started the probe, so we stop it at the end
        self.report_path: Path | None = None
        self.run_dir: Path | None = None
        self._sent: set[tuple[str, str]] = set()
        self._alerts: bool | None = None

    def begin(self, base: str | os.PathLike[str], model: Any, optimizer: Any = None) -> None:
        try:
            current = sessions.current()
            if current is None:
                options = {"run_dir": str(run_dir_under(base)), "alerts": False, **self.options}
                current = sessions.start(**options)
                self.owned = True
            else:
                # The trainer's logger carries the diagnoses now: no second copy on stderr.
                self._alerts = current.config.alerts
                current.configure(alerts=False)
            self.session = current
            self.run_dir = Path(current.run_dir)
            self._sent = {_seen(d) for d in current.diagnoses()}
            if model is not None:
                recorder = current.ensure_telemetry()
                if recorder is not None:
                    recorder.watch(model, unwrap_optimizer(optimizer) if optimizer else None)
            elif current.telemetry is not None:
                current.telemetry.rediscover()  # this training's optimizer: the next to step
        except Exception as exc:
            warn_once("integration-begin", f"off for this training: {exc}")
            self.session = None

    def new_diagnoses(self) -> list[Any]:
        """Diagnoses found since the last call (a rise in severity counts as new)."""
        if self.session is None:
            return []
        try:
            found = self.session.diagnoses()
        except Exception:
            return []
        new = [d for d in found if _seen(d) not in self._sent]
        self._sent.update(_seen(d) for d in new)
        return new

    def finish(
        self, forward: Callable[[list[Any]], None], crash: BaseException | None = None
    ) -> Path | None:
        """Save everything, hand the last diagnoses to `forward`, write the report."""
        session = self.session
        if session is None:
            return None
        try:
            if crash is not None:
                session.report_crash(crash)
            if self.owned:
                session.stop(1 if crash is not None else None)  # the doctor's last pass, saved
            else:
                session.flush()
                if self._alerts is not None:
                    session.configure(alerts=self._alerts)
        except Exception as exc:
            warn_once("integration-finish", f"could not save the run: {exc}")
        try:
            forward(self.new_diagnoses())
        except Exception as exc:
            warn_once("integration-forward", f"could not log the diagnoses: {exc}")
        if self.report:
            try:
                self.report_path = write_report(session.run_dir)
            except Exception as exc:
                warn_once("integration-report", f"could not write the report: {exc}")
        self.session = None
        return self.report_path


def _seen(diagnosis: Any) -> tuple[str, str]:
    return (diagnosis.identity, diagnosis.severity)
