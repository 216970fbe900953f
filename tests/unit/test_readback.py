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


@pytest.mark.cuda
def test_steady_copies_reuse_their_pinned_buffers() -> None:
    # A new pinned buffer is a call to the host allocator, which queries CUDA events: after a
    # device-side assert that query would be the first call to meet the error (module doc).
    rb = Readback(torch)
    got: list[list[float]] = []
    for i in range(200):
        rb.submit(torch.tensor([float(i)], device="cuda"), got.append)
        rb._copy_batch()
        rb.poll()
    wait_for(lambda: rb.poll() or len(got) == 200, 10, "every value to land")
    assert got == [[float(i)] for i in range(200)]
    assert len(rb._owned) <= 4, len(rb._owned)  # the copies in flight at once, no more


@pytest.mark.cuda
def test_bfloat16_values_and_a_wait_for_the_stream() -> None:
    rb = Readback(torch)
    got: list[object] = []
    rb.submit(torch.tensor([1.5, -2.0], device="cuda", dtype=torch.bfloat16), got.append)
    rb.after(lambda: got.append("after"))
    rb.poll(force=True)
    assert got == [[1.5, -2.0], "after"]


def test_values_that_cannot_be_copied_back_are_reported_lost() -> None:
    # Where no copy can be made any more (after a device-side assert the GPU refuses every
    # call; here pinned memory, which a machine without a GPU cannot give), the submissions
    # still waiting are handed to their `lost` callbacks at the end: a step's row is then
    # written without its values instead of not at all.
    if torch.cuda.is_available():
        pytest.skip("pinned memory works here: the copy would succeed")
    rb = Readback(torch)
    got: list[list[float]] = []
    lost: list[str] = []
    rb._batch.append((torch.tensor([1.0, 2.0]), got.append, lambda: lost.append("row 1")))
    rb._batch.append((torch.tensor([3.0]), got.append, None))  # no row: nothing to write
    rb._batch.append((torch.tensor([4.0]), got.append, lambda: lost.append("row 2")))
    rb.poll_at_end()
    assert got == [] and lost == ["row 1", "row 2"] and len(rb) == 0
