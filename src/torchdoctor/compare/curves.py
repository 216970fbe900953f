"""Loss and gradient norm of two runs, step by step: bit-identical up to which step (as `repro`
asks of two runs of one script, here of two saved runs), and how far apart the curves are after.

Steps are matched by number, on each run's primary rank. Two values are the same when their bits
are (NaN matches NaN); a value recorded in one run and not the other (NULL) is a difference.
The gap after the first difference is relative to A's value at each step; the final values are
the medians of the last FINAL_STEPS steps, so that one noisy step does not decide them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchdoctor._json import float_text

FINAL_STEPS = 10
SERIES = ("loss", "grad_norm")


def compare_curves(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
    """For each series: the steps compared, the first step that differs (None: identical over
    them), and the gap after it."""
    steps, ia, ib = np.intersect1d(a["step"], b["step"], return_indices=True)
    out: dict[str, Any] = {"steps": [len(a["step"]), len(b["step"])]}
    out["common_steps"] = len(steps)
    for name in SERIES:
        out[name] = _series(steps, a[name][ia], b[name][ib], a[name], b[name])
    return out


def _series(
    steps: np.ndarray, x: np.ndarray, y: np.ndarray, all_x: np.ndarray, all_y: np.ndarray
) -> dict[str, Any]:
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    differ = np.flatnonzero(~same)
    out: dict[str, Any] = {
        "compared": len(steps),
        "recorded": bool(np.isfinite(all_x).any() or np.isfinite(all_y).any()),
        "first_difference": None,
        "identical_steps": len(steps),
        "final": [_final(all_x), _final(all_y)],
    }
    a_final, b_final = out["final"]
    out["final_change"] = (
        None if a_final is None or b_final is None or a_final == 0 else b_final / a_final - 1
    )
    if not len(differ):
        return out
    first = int(differ[0])
    out["first_difference"] = int(steps[first])
    out["identical_steps"] = first
    out["at_first"] = [_num(x[first]), _num(y[first])]
    after_x, after_y = x[first:], y[first:]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(after_y - after_x) / np.abs(after_x)
    rel = rel[np.isfinite(rel)]
    out["gap_median"] = float(np.median(rel)) if len(rel) else None
    out["gap_max"] = float(rel.max()) if len(rel) else None
    return out


def _final(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)][-FINAL_STEPS:]
    return float(np.median(v)) if len(v) else None


def _num(value: float) -> float | str:
    return float(value) if np.isfinite(value) else float_text(float(value))
