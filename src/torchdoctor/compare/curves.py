"""Loss and gradient norm of two runs, step by step: bit-identical up to which step (as `repro`
asks of two runs of one script, here of two saved runs), and how far apart the curves are after.

Steps are matched by number, on each run's primary rank. Two values are the same when their bits
are (NaN matches NaN); a value recorded in one run and not the other (NULL) is a difference.
The gap after the first difference is relative to A's value at each step; the final values are
the medians of the last FINAL_STEPS steps, so that one noisy step does not decide them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from torchdoctor._json import fields, float_text

FINAL_STEPS = 10
SERIES = ("loss", "grad_norm")


@dataclasses.dataclass(frozen=True)
class Series:
    """One series (loss or gradient norm) over the steps both runs have."""

    compared: int  # steps both runs have
    recorded: bool  # a finite value in either run
    first_difference: int | None  # the first step whose values differ (None: identical)
    identical_steps: int
    final: tuple[float | None, float | None]  # median of each run's last FINAL_STEPS values
    final_change: float | None  # B's final against A's, as a fraction
    # after the first difference: both values there, and the gap that follows (relative to A)
    at_first: tuple[float | str, float | str] | None = None
    gap_median: float | None = None
    gap_max: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.first_difference is None:  # nothing after a difference to say
            for key in ("at_first", "gap_median", "gap_max"):
                del out[key]
        return out


@dataclasses.dataclass(frozen=True)
class Curves:
    steps: tuple[int, int]  # each run's, on its primary rank
    common_steps: int
    loss: Series
    grad_norm: Series


def compare_curves(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> Curves:
    """For each series: the steps compared, the first step that differs (None: identical over
    them), and the gap after it."""
    steps, ia, ib = np.intersect1d(a["step"], b["step"], return_indices=True)
    loss, grad_norm = (_series(steps, a[n][ia], b[n][ib], a[n], b[n]) for n in SERIES)
    return Curves((len(a["step"]), len(b["step"])), len(steps), loss, grad_norm)


def _series(
    steps: np.ndarray, x: np.ndarray, y: np.ndarray, all_x: np.ndarray, all_y: np.ndarray
) -> Series:
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    differ = np.flatnonzero(~same)
    a_final, b_final = _final(all_x), _final(all_y)
    head = Series(
        compared=len(steps),
        recorded=bool(np.isfinite(all_x).any() or np.isfinite(all_y).any()),
        first_difference=None,
        identical_steps=len(steps),
        final=(a_final, b_final),
        final_change=(
            None if a_final is None or b_final is None or a_final == 0 else b_final / a_final - 1
        ),
    )
    if not len(differ):
        return head
    first = int(differ[0])
    after_x, after_y = x[first:], y[first:]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(after_y - after_x) / np.abs(after_x)
    rel = rel[np.isfinite(rel)]
    return dataclasses.replace(
        head,
        first_difference=int(steps[first]),
        identical_steps=first,
        at_first=(_num(x[first]), _num(y[first])),
        gap_median=float(np.median(rel)) if len(rel) else None,
        gap_max=float(rel.max()) if len(rel) else None,
    )


def _final(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)][-FINAL_STEPS:]
    return float(np.median(v)) if len(v) else None


def _num(value: float) -> float | str:
    return float(value) if np.isfinite(value) else float_text(float(value))
