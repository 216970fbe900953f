"""Readback: CPU values at once; GPU values copied back together while submissions come fast,
at once when they come slowly, always handed over in submission order."""

from __future__ import annotations

import pytest
import torch
from helpers import wait_for

from torchdoctor.telemetry.readback import BATCH, Readback


def test_cpu_values_are_handed_over_at_once() -> None:
    got: list[list[float]] = []
    Readback(torch).submit(torch.tensor([1.5, 2.0]), got.append)
    assert got == [[1.5, 2.0]]


@pytest.mark.cuda
def test_gpu_values_come_back_batched_and_in_order() -> None:
    rb = Readback(torch)
    got: list[list[float]] = []
    rb.submit(torch.tensor([-1.0], device="cuda"), got.append)  # the first: nothing to wait for
    assert not rb._batch and len(rb._pending) == 1
    n = 3 * BATCH + 5
    for i in range(n):
        dtype = torch.float64 if i % 3 else torch.float32  # cat promotes; values stay exact
        rb.submit(torch.tensor([i, i + 0.5], device="cuda", dtype=dtype), got.append)
    assert len(rb._pending) <= 1 + n // BATCH + 1  # a copy per batch, not per submission
    rb.poll(force=True)
    assert got == [[-1.0]] + [[float(i), i + 0.5] for i in range(n)]


@pytest.mark.cuda
def test_a_lone_gpu_value_lands_without_a_forced_wait() -> None:
    rb = Readback(torch)
    got: list[list[float]] = []
    rb.submit(torch.tensor([3.0], device="cuda"), got.append)
    wait_for(lambda: rb.poll() or got, 10, "the value to land")
    assert got == [[3.0]]
