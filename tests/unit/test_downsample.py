"""Downsampling keeps what a reader looks for: each bucket's extremes, non-finite values, the
diagnosed steps, the ends; and stays within its budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from torchdoctor.digest.downsample import downsample


def test_short_series_are_kept_whole() -> None:
    x = np.arange(50)
    assert downsample(x, [np.random.rand(50)], 100).tolist() == list(range(50))


def test_every_bucket_keeps_its_min_and_max() -> None:
    rng = np.random.default_rng(0)
    n, budget = 100_003, 1000
    x = np.arange(n) * 3  # steps need not be indices
    a, b = rng.normal(size=n), rng.exponential(size=n)
    kept = set(downsample(x, [a, b], budget).tolist())
    per_bucket = 2 * 2
    width = math.ceil(n / (budget // per_bucket))
    for lo in range(0, n, width):
        hi = min(n, lo + width)
        for v in (a, b):
            assert lo + int(np.argmin(v[lo:hi])) in kept
            assert lo + int(np.argmax(v[lo:hi])) in kept
    assert int(np.argmax(a)) in kept and int(np.argmin(b)) in kept  # the global extremes
    assert {0, n - 1} <= kept
    assert len(kept) <= budget + 2


def test_non_finite_values_and_named_steps_survive() -> None:
    n = 1_000_000
    x = np.arange(n)
    loss = np.linspace(5, 1, n)
    loss[123_457] = math.nan
    loss[654_321] = math.inf
    loss[700_000] = -math.inf
    idx = downsample(x, [loss], 2000, keep=[42, 999_998, 31_337])
    kept = set(idx.tolist())
    assert {123_457, 654_321, 700_000} <= kept
    assert {42, 999_998, 31_337} <= kept
    assert len(idx) <= 2000 + 2 + 3
    assert np.all(np.diff(idx) > 0)  # ascending, no duplicates


def test_a_bucket_of_nans_keeps_one() -> None:
    x = np.arange(10_000)
    v = np.full(10_000, math.nan)
    idx = downsample(x, [v], 100)
    assert 0 < len(idx) <= 102


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        downsample(np.arange(10), [np.arange(9)], 2)
    with pytest.raises(ValueError):
        downsample(np.arange(10), [np.arange(10)], 0)
