"""`exploding_gradients` thresholds: the usual norm comes from before the climb, never from
the climb; warm-ups, noise and restarts raise nothing."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import series_inputs

from torchdoctor.diagnose import exploding_gradients


def _found(norms, lr=None):  # type: ignore[no-untyped-def]
    return exploding_gradients.diagnose(series_inputs([1.0] * len(norms), list(norms), lr))


def test_a_norm_growing_from_the_first_step_is_judged_against_that_step() -> None:
    norms = 0.8 * 3.16 ** np.arange(40)  # the gradient of a loss growing tenfold a step
    found = _found(norms)
    first = found[0]
    assert first.step <= 7
    assert first.evidence.typical_grad_norm == pytest.approx(0.8)  # not learned from the climb
    assert first.evidence.typical_over_steps == 1


@pytest.mark.parametrize(("rate", "within"), [(1.1, 30), (1.3, 12), (2.0, 6), (3.16, 5)])
def test_a_climb_is_compared_with_where_it_started(rate, within) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    before = np.exp(rng.normal(0, 0.3, 200))
    climb = before[-1] * rate ** np.arange(1, 120) * np.exp(rng.normal(0, 0.05, 119))
    found = _found(np.concatenate([before, climb]))
    assert found, rate
    first = found[0]
    assert 200 <= first.step <= 199 + within, (rate, first.step)
    # The usual level is that of the 200 steps before, whatever the climb's length.
    assert 0.7 < first.evidence.typical_grad_norm < 1.4
    if first.severity == "warning":
        assert found[-1].severity == "error" and found[-1].step > first.step


def test_a_single_huge_spike_is_an_error() -> None:
    norms = np.exp(np.random.default_rng(3).normal(0, 0.2, 300))
    norms[250] = 5e3
    [found] = _found(norms)
    assert found.step == 250 and found.severity == "error"


def _lognormal(rng: np.random.Generator, n: int) -> tuple[np.ndarray, None]:
    return np.exp(rng.normal(0, 0.5, n)), None


def _warmup(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(n)
    lr = np.minimum(1.0, t / 300) * 1e-3
    return (0.5 + 5 * np.minimum(1, t / 300)) * np.exp(rng.normal(0, 0.3, n)), lr


def _sgdr(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    lr = 0.5 * (1 + np.cos(np.pi * (np.arange(n) % 500) / 500)) + 1e-4
    return (0.2 + 2 * lr) * np.exp(rng.normal(0, 0.3, n)), lr  # 10x back up at each restart


@pytest.mark.parametrize("curve", [_lognormal, _warmup, _sgdr])
def test_healthy_norms_raise_nothing(curve) -> None:  # type: ignore[no-untyped-def]
    for seed in range(40):
        norms, lr = curve(np.random.default_rng(seed), 3000)
        found = _found(norms, lr)
        assert not found, (curve.__name__, seed, found[0].summary)


def test_a_schedule_that_multiplies_the_rate_past_anything_before_is_caught() -> None:
    # The learning rate goes up tenfold (a StepLR with gamma=10): back toward the start is
    # not enough to excuse it once the norm passes every level of the run.
    rng = np.random.default_rng(0)
    lr = np.repeat([1e-3, 1e-2, 1e-1], 100)
    norms = 2.0 * np.exp(-np.arange(300) / 30) + 0.1
    norms[200:] = 0.1 * 2.0 ** np.arange(100)
    norms *= np.exp(rng.normal(0, 0.05, 300))
    found = _found(norms, lr)
    assert found and 200 < found[0].step <= 210


def test_a_long_run_is_judged_on_its_newest_steps() -> None:
    rng = np.random.default_rng(7)
    norms = np.exp(rng.normal(0, 0.3, 30_000))
    assert not _found(norms)
    norms[29_000:] *= 2.0 ** np.minimum(np.arange(1_000), 40)
    found = _found(norms, np.full(30_000, 1e-3))
    assert found and 29_000 <= found[0].step <= 29_006
