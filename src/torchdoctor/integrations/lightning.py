"""torchdoctor for the Lightning Trainer (`lightning.pytorch`, or `pytorch_lightning` when
only that is installed).

    from torchdoctor.integrations.lightning import TorchdoctorCallback
    trainer = Trainer(..., callbacks=[TorchdoctorCallback()])

- Steps are the Trainer's optimizer steps (`trainer.global_step`); with
  `accumulate_grad_batches=N` each step holds N micro-batches. Lightning runs forward and
  backward inside `optimizer.step(closure)`: the probe checks the gradients when the closure
  returns, so gradient norms and non-finite checks are those of the update.
- The run directory is `<trainer.log_dir>/torchdoctor-runs/<date>-<host>-<pid>/` (log_dir is the
  logger's versioned directory, or default_root_dir without a logger), unless a probe already
  runs in this process.
- Each diagnosis, as it is found, is logged as a warning through Lightning's Python logger and
  sent to every `trainer.loggers` entry as numbers (`log_metrics`):
  `torchdoctor/<kind>` = severity (1 info, 2 warning, 3 error) and `torchdoctor/diagnoses` =
  how many so far, at `trainer.global_step`.
- At the end of fit (or on an exception): the tables are saved, the run directory's
  report.html is written.

Needs `pip install torchdoctor[lightning]`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:
    try:
        import pytorch_lightning as pl
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise ImportError(
            "torchdoctor.integrations.lightning needs Lightning: "
            "pip install 'torchdoctor[lightning]'"
        ) from exc

from torchdoctor.integrations.training_run import SEVERITY_LEVEL, TrainingRun
from torchdoctor.report.alerts import render_alert

log = logging.getLogger(f"{pl.__name__}.callbacks.torchdoctor")


class TorchdoctorCallback(pl.Callback):
    """Follow a Lightning fit with torchdoctor. `report=False` skips the HTML report; other
    keyword arguments are torchdoctor.start() options, used when this callback starts the
    probe."""

    def __init__(self, report: bool = True, **options: Any) -> None:
        super().__init__()
        self.run = TrainingRun(report, options)
        self._count = 0

    @property
    def run_dir(self) -> Path | None:
        return self.run.run_dir

    @property
    def report_path(self) -> Path | None:
        return self.run.report_path

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # The LightningModule is not watched as a model: training_step is not a module call, so
        # the probe finds the models as the outermost module calls instead (self.net(x), or
        # self(x)), which also times forward and lets a NaN step be replayed. The optimizer is
        # the first one that steps.
        self._count = 0
        self.run.begin(trainer.log_dir or trainer.default_root_dir, None)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self._forward(trainer, self.run.new_diagnoses())

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer, exception)

    def _finish(self, trainer: Any, crash: BaseException | None = None) -> None:
        if self.run.session is None:
            return
        path = self.run.finish(lambda found: self._forward(trainer, found), crash)
        for logger in trainer.loggers:
            logger.save()
        if path is not None:
            log.warning(f"torchdoctor: report written to {path}")

    def _forward(self, trainer: Any, found: list[Any]) -> None:
        for diagnosis in found:
            self._count += 1
            log.warning(render_alert(diagnosis))
            metrics = {
                f"torchdoctor/{diagnosis.kind}": float(SEVERITY_LEVEL[diagnosis.severity]),
                "torchdoctor/diagnoses": float(self._count),
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
