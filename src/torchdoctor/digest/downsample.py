"""Fewer points for a long series, keeping what a reader looks for.

A million-step run cannot go into a page point by point. The rows are cut into buckets of equal
count; each bucket keeps, for every series, its smallest and its largest value (a NaN or an
infinity counts as the largest, so a non-finite loss is never dropped), and every row the caller
names (the diagnosed steps) is kept whatever bucket it falls in. Kept points are real rows, never
averages, so a phase breakdown still adds up to its step's duration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np


def downsample(
    x: np.ndarray,
    series: Sequence[np.ndarray],
    max_points: int,
    keep: Iterable[float] = (),
) -> np.ndarray:
    """Indices (ascending) of the rows to draw.

    `x` is the rows' position (steps, in order), `series` the values drawn against it. At most
    about `max_points` rows are kept, plus the first and the last, plus the rows whose `x` is in
    `keep`.
    """
    n = len(x)
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    if n <= max_points:
        return np.arange(n)
    per_bucket = 2 * max(1, len(series))
    buckets = max(1, max_points // per_bucket)
    width = -(-n // buckets)  # ceil
    buckets = -(-n // width)
    chosen = [np.array([0, n - 1])]
    offsets = np.arange(buckets) * width
    for values in series:
        v = np.asarray(values, dtype=np.float64)
        if len(v) != n:
            raise ValueError("every series must be as long as x")
        high = np.where(np.isfinite(v), v, np.inf)  # NaN and +-inf are extremes
        low = np.where(np.isnan(v), np.inf, v)  # -inf stays the minimum
        chosen.append(offsets + _arg(low, width, buckets, np.argmin, np.inf))
        chosen.append(offsets + _arg(high, width, buckets, np.argmax, -np.inf))
    wanted = np.fromiter(keep, dtype=np.float64)
    if wanted.size:
        chosen.append(np.flatnonzero(np.isin(np.asarray(x, dtype=np.float64), wanted)))
    out = np.unique(np.concatenate(chosen))
    return out[out < n]


def _arg(
    values: np.ndarray, width: int, buckets: int, pick: Callable[..., np.ndarray], pad: float
) -> np.ndarray:
    """pick (argmin or argmax) within each bucket of `width` rows, the last bucket padded."""
    padded = np.full(buckets * width, pad)
    padded[: len(values)] = values
    return pick(padded.reshape(buckets, width), axis=1)
