"""dataloader_bound's thresholds on made-up step tables: a steady wait is a starved model, one
long pause is not (the docs' example run met one on a busy machine)."""

from __future__ import annotations

import numpy as np
from helpers import series_inputs

from torchdoctor.diagnose import dataloader_bound

STEPS = 24  # the docs' example run: 3 epochs of 8 batches
STEP = 0.007


def _found(wait: np.ndarray) -> list[str]:
    inputs = series_inputs(
        [1.0] * STEPS, columns={"duration": np.full(STEPS, STEP) + wait, "data_wait": wait}
    )
    return [d.severity for d in dataloader_bound.diagnose(inputs)]


def test_a_steady_wait_is_found() -> None:
    assert _found(np.full(STEPS, 0.004)) == ["info"]  # 36% of each step
    assert _found(np.full(STEPS, 0.010)) == ["warning"]


def test_a_wait_at_every_few_batches_is_found() -> None:
    wait = np.zeros(STEPS)
    wait[::4] = 0.03  # a shard opened at every fourth batch
    assert _found(wait) == ["warning"]


def test_one_long_pause_is_not_a_starved_model() -> None:
    wait = np.full(STEPS, 0.0003)  # batches sliced from memory
    wait[9] = 0.07  # one fetch preempted: 34% of the window's time, all in one half
    assert _found(wait) == []
