"""Small numeric helpers the diagnoses share: finite windows and robust summaries."""

from __future__ import annotations

import numpy as np

from torchdoctor.diagnose.inputs import Inputs


def finite(inputs: Inputs, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a steps column where it has a finite value (views, not copies, when
    every value is: the doctor reads a million-row table every second)."""
    values = inputs.column(column).astype(float, copy=False)
    keep = inputs.valid(column) & np.isfinite(values)
    if keep.all():
        return inputs.column("step"), values
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


def _med3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def median3(values: np.ndarray) -> np.ndarray:
    """Median of each value and the two before it (NaN for the first two)."""
    out = np.full(values.size, np.nan)
    if values.size >= 3:
        out[2:] = _med3(values[:-2], values[1:-1], values[2:])
    return out


def median5(values: np.ndarray) -> np.ndarray:
    """Median of each value and the four before it (NaN for the first four): two batches'
    spikes never move it. Branch-free min/max, so it runs over a million steps in
    milliseconds: median(a..e) = median3(e, max(min(a,b), min(c,d)), min(max(a,b), max(c,d)))."""
    out = np.full(values.size, np.nan)
    if values.size >= 5:
        a, b, c, d, e = (values[i : values.size - 4 + i] for i in range(5))
        low = np.maximum(np.minimum(a, b), np.minimum(c, d))
        high = np.minimum(np.maximum(a, b), np.maximum(c, d))
        out[4:] = _med3(e, low, high)
    return out


CHUNK = 65_536


def median5_summary(values: np.ndarray) -> tuple[float, int, float, float] | None:
    """Of median5(values): (lowest, where, highest up to there, highest), NaN left out; None
    when all are NaN. In chunks, so a million values need no million-long temporaries."""
    best, best_at, ceiling, highest = np.inf, -1, -np.inf, -np.inf
    for start in range(0, values.size, CHUNK):
        lo = max(0, start - 4)
        chunk = median5(values[lo : start + CHUNK])[start - lo :]
        if np.isnan(chunk).all():
            continue
        at = chunk.size - 1 - int(np.nanargmin(chunk[::-1]))  # the last of equal lows
        if chunk[at] <= best:  # a new lowest: the ceiling is everything up to it
            ceiling = max(highest, float(np.nanmax(chunk[: at + 1])))
            best, best_at = float(chunk[at]), start + at
        highest = max(highest, float(np.nanmax(chunk)))
    return None if best_at < 0 else (best, best_at, ceiling, highest)


def run_lengths(mask: np.ndarray) -> np.ndarray:
    """For each index, how many consecutive True values end there (0 where False)."""
    idx = np.arange(mask.size)
    last_false = np.maximum.accumulate(np.where(mask, -1, idx)) if mask.size else idx
    return idx - last_false


def first_true(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None
