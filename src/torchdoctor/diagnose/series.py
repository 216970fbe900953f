"""Small numeric helpers the diagnoses share: finite windows and robust summaries."""

from __future__ import annotations

import numpy as np

from torchdoctor.diagnose.inputs import Inputs


def finite(inputs: Inputs, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a steps column where it has a finite value."""
    values = inputs.column(column).astype(float)
    keep = inputs.valid(column) & np.isfinite(values)
    return inputs.column("step")[keep], values[keep]


def smooth(values: np.ndarray, window: int = 5) -> np.ndarray:
    """Running median: robust to the single-batch spikes every healthy run has."""
    if values.size < window:
        return values.copy()
    stacked = np.lib.stride_tricks.sliding_window_view(values, window)
    return np.concatenate([np.full(window - 1, np.nan), np.median(stacked, axis=1)])


def slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of y over x, and the fit's R squared."""
    if x.size < 3 or np.ptp(x) == 0:
        return 0.0, 0.0
    xm, ym = x - x.mean(), y - y.mean()
    denom = float((xm * xm).sum())
    b = float((xm * ym).sum()) / denom
    ss_tot = float((ym * ym).sum())
    r2 = 0.0 if ss_tot == 0 else 1.0 - float(((ym - b * xm) ** 2).sum()) / ss_tot
    return b, r2
