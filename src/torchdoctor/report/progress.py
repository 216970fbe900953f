"""The compact live status line `torchdoctor run` keeps on a terminal's last line."""

from __future__ import annotations

from typing import Any

from torchdoctor.report.summary import seconds
from torchdoctor.units import human


def render_status(last: dict[str, Any], diagnoses: int = 0, width: int = 100) -> str:
    if not last:
        return "torchdoctor | waiting for the first step"
    parts = [f"step {last['step']:,}", f"{seconds(last['duration'])}/step"]
    if last.get("duration"):
        parts.append(f"data {100 * last.get('data_wait', 0.0) / last['duration']:.0f}%")
    loss = last.get("loss")
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    if last.get("allocated"):
        parts.append(f"mem {human(last['allocated'])}")
    if diagnoses:
        parts.append(f"{diagnoses} diagnos{'i' if diagnoses == 1 else 'e'}s")
    return ("torchdoctor | " + " | ".join(parts))[:width]
