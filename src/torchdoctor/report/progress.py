"""The compact live status line `torchdoctor run` keeps on a terminal's last line."""

from __future__ import annotations

from torchdoctor.report.summary import seconds
from torchdoctor.telemetry.step_rows import StepHeadline
from torchdoctor.units import human


def render_status(last: StepHeadline | None, diagnoses: int = 0, width: int = 100) -> str:
    if last is None:
        return "torchdoctor | waiting for the first step"
    parts = [f"step {last.step:,}", f"{seconds(last.duration)}/step"]
    if last.duration:
        parts.append(f"data {100 * last.data_wait / last.duration:.0f}%")
    if last.loss is not None:
        parts.append(f"loss {last.loss:.4g}")
    if last.allocated:
        parts.append(f"mem {human(last.allocated)}")
    if diagnoses:
        parts.append(f"{diagnoses} diagnos{'i' if diagnoses == 1 else 'e'}s")
    return ("torchdoctor | " + " | ".join(parts))[:width]
