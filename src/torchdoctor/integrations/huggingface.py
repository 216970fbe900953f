"""torchdoctor for the Hugging Face `transformers` Trainer.

    from torchdoctor.integrations.huggingface import TorchdoctorCallback
    trainer = Trainer(..., callbacks=[TorchdoctorCallback()])

- Steps are the Trainer's optimizer steps: the probe counts steps of the torch optimizer inside
  accelerate's wrapper, which the Trainer steps once per `gradient_accumulation_steps`
  micro-batches, so `python.steps` has one row per `state.global_step`.
- The run directory is `<output_dir>/torchdoctor-runs/<date>-<host>-<pid>/` (when no probe runs
  yet in this process; otherwise the running probe keeps its own).
- Each diagnosis, as it is found, is logged as a warning through the `transformers` logger
  (`transformers.integrations.torchdoctor`) and appended to `state.log_history` (saved with
  every checkpoint's trainer_state.json) as `torchdoctor_*` keys.
- At the end of training: the tables are saved and `<run_dir>/report.html` is written.

Needs `pip install torchdoctor[hf]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "torchdoctor.integrations.huggingface needs transformers: pip install 'torchdoctor[hf]'"
    ) from exc

from torchdoctor.integrations.training_run import TrainingRun
from torchdoctor.report.alerts import render_alert

logger = hf_logging.get_logger("transformers.integrations.torchdoctor")


class TorchdoctorCallback(TrainerCallback):
    """Follow a Trainer's training with torchdoctor. `report=False` skips the HTML report;
    other keyword arguments are torchdoctor.start() options (trace_every, guard, listen,
    metrics, ...), used when this callback starts the probe."""

    def __init__(self, report: bool = True, **options: Any) -> None:
        self.run = TrainingRun(report, options)

    @property
    def run_dir(self) -> Path | None:
        """Where this training is recorded (None before it begins)."""
        return self.run.run_dir

    @property
    def report_path(self) -> Path | None:
        """The HTML report, once training has ended."""
        return self.run.report_path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.begin(args.output_dir or ".", kwargs.get("model"), kwargs.get("optimizer"))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._forward(state, self.run.new_diagnoses())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = self.run.finish(lambda found: self._forward(state, found))
        if path is not None:
            state.log_history.append({"torchdoctor_report": str(path), "step": state.global_step})
            logger.warning(f"torchdoctor: report written to {path}")

    def _forward(self, state: Any, found: list[Any]) -> None:
        for diagnosis in found:
            logger.warning(render_alert(diagnosis))
            state.log_history.append(
                {
                    "torchdoctor_kind": diagnosis.kind,
                    "torchdoctor_severity": diagnosis.severity,
                    "torchdoctor_summary": diagnosis.summary,
                    "torchdoctor_location": diagnosis.location,
                    "torchdoctor_fix": diagnosis.fix[0] if diagnosis.fix else None,
                    "step": state.global_step,
                }
            )
