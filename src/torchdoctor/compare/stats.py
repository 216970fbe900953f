"""Is a difference between two runs real, or the machine's noise?

Two runs are two samples of step times (or of a phase's, or of a module's time per traced step).
The figure reported is the ratio of their medians, B over A, with a bootstrap interval: each run's
values are drawn again with replacement, independently, DRAWS times, and the 2.5th and 97.5th
percentiles of the ratios of the drawn medians bound it (as benchmarks/_interleave.py bounds
its median ratio).

A difference is called real when the whole 95% interval lies beyond the noise floor on one side:
above 1 + floor, or below 1 / (1 + floor). The floor is MIN_EFFECT, or more when a run differs
from itself by more: the ratio of the medians of its second half and its first half (a machine
whose load changed while it ran). A difference smaller than what a run shows against itself
cannot be told from the machine's mood (a run of fewer than MIN_DRIFT steps is too short to
tell its halves apart: the interval alone speaks for it). A value that is small in absolute
terms (a phase of a few microseconds whose ratio looks large) is not real either: below
`min_delta` seconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

DRAWS = 2000
LEVEL = 0.95
# Differences under 10% are never called real: two runs of the same code, one after the other on
# a shared machine, differ by that much (measured: up to 30% on a loaded 2-core machine) for
# reasons no figure of a single run shows (a neighbour on the other hyperthread, the caches).
# `compare --noise-floor 5%` for a quiet, dedicated machine.
MIN_EFFECT = 0.10
MAX_SAMPLES = 1000  # the most recent values used (the bootstrap's cost grows with them)
MIN_SAMPLES = 3  # fewer values give no interval
MIN_DRIFT = 40  # values from which a run's halves are compared
SEED = 0


@dataclasses.dataclass(frozen=True)
class Change:
    """A quantity in A and in B (medians), and whether B differs from A beyond noise."""

    a: float | None
    b: float | None
    ratio: float | None  # b / a
    low: float | None  # 95% bootstrap interval of the ratio
    high: float | None
    floor: float  # the noise floor used, as a fraction (0.05: 5%)
    real: bool
    n: tuple[int, int]  # values compared in A and in B

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    def to_json(self) -> dict[str, object]:
        return {
            "a": self.a,
            "b": self.b,
            "delta": self.delta,
            "ratio": self.ratio,
            "interval": None if self.low is None else [self.low, self.high],
            "noise_floor": self.floor,
            "real": self.real,
            "n": list(self.n),
        }


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return v[-MAX_SAMPLES:]


def drift(values: np.ndarray) -> float:
    """How much a run differs from itself: |ratio - 1| of its halves' medians, as a fraction
    (0 for fewer than MIN_DRIFT values: the medians of a few steps differ by chance alone)."""
    if len(values) < MIN_DRIFT:
        return 0.0
    half = len(values) // 2
    first, second = float(np.median(values[:half])), float(np.median(values[half:]))
    if first <= 0 or second <= 0:
        return 0.0
    return math.exp(abs(math.log(second / first))) - 1


def bootstrap_ratio(
    a: np.ndarray, b: np.ndarray, draws: int = DRAWS, level: float = LEVEL
) -> tuple[float, float]:
    """The `level` interval of median(B*) / median(A*), A* and B* drawn with replacement."""
    rng = np.random.default_rng(SEED)
    ma = np.median(a[rng.integers(0, len(a), (draws, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (draws, len(b)))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.sort(mb / ma)
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return math.nan, math.nan
    cut = int(len(ratios) * (1 - level) / 2)
    return float(ratios[cut]), float(ratios[len(ratios) - 1 - cut])


def change(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    min_delta: float = 0.0,
    min_effect: float = MIN_EFFECT,
) -> Change:
    """Medians of `a` and `b` (seconds, bytes...), their ratio, its interval, and the verdict."""
    va, vb = _clean(a), _clean(b)
    ma = float(np.median(va)) if len(va) else None
    mb = float(np.median(vb)) if len(vb) else None
    floor = max(min_effect, drift(va), drift(vb))
    n = (len(va), len(vb))
    if ma is None or mb is None:
        return Change(ma, mb, None, None, None, floor, False, n)
    ratio = mb / ma if ma > 0 else None
    if len(va) < MIN_SAMPLES or len(vb) < MIN_SAMPLES or ratio is None:
        return Change(ma, mb, ratio, None, None, floor, False, n)
    low, high = bootstrap_ratio(va, vb)
    if math.isnan(low):
        return Change(ma, mb, ratio, None, None, floor, False, n)
    beyond = low > 1 + floor or high < 1 / (1 + floor)
    real = beyond and abs(mb - ma) >= min_delta
    return Change(ma, mb, ratio, low, high, floor, real, n)
