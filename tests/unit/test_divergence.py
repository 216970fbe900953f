"""`divergence` thresholds on synthetic and real loss curves: caught within a few steps of
the start of geometric growth, before the Inf; never on healthy curves (warm-up, noise,
restarts, spikes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import series_inputs

from torchdoctor.diagnose import divergence

CURVES = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "loss_curves" / "curves.json").read_text()
)
F32 = 3.4028235e38


def _found(loss, **kw):  # type: ignore[no-untyped-def]
    return divergence.diagnose(series_inputs(list(loss), **kw))


def _overflowing(values: np.ndarray) -> list[float]:
    return [float(v) if v < F32 else math.inf for v in values]


def test_tenfold_per_step_is_caught_by_step_5_not_31() -> None:
    loss = _overflowing(0.7 * 10.0 ** np.arange(60))
    inf_at = next(i for i, v in enumerate(loss) if math.isinf(v))
    found = _found(loss)
    first = found[0]
    assert first.step <= 5
    assert first.evidence.rule == "geometric"
    assert first.evidence.onset_step == 0
    assert first.evidence.growth_per_step == pytest.approx(10.0)
    assert first.evidence.non_finite_step == inf_at > first.step
    assert first.severity == "error"
    assert "10x per step" in first.summary and f"non-finite at step {inf_at}" in first.summary


@pytest.mark.parametrize(
    ("rate", "within"), [(1.5, 18), (2.0, 10), (3.0, 7), (5.0, 5), (10.0, 4), (100.0, 4)]
)
def test_geometric_growth_after_healthy_training_is_caught_within_steps(rate, within) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    healthy = 2.3 * np.exp(-np.arange(300) / 80) + 0.05 + 0.02 * rng.random(300)
    with np.errstate(over="ignore"):
        climb = healthy[-1] * rate ** np.arange(1, 400) * np.exp(rng.normal(0, 0.05, 399))
    loss = _overflowing(np.concatenate([healthy, climb]))
    found = _found(loss)
    assert found, rate
    first = found[0]
    assert 300 <= first.step <= 299 + within, (rate, first.step)
    assert first.step < next(i for i, v in enumerate(loss) if not math.isfinite(v))
    # The baseline is the level before the climb, not the climb itself.
    assert first.evidence.onset_loss < 2 * healthy[-10:].max()
    if first.severity == "warning":  # escalated once it stood 10^4x above its baseline
        assert [d.severity for d in found] == ["warning", "error"]
        assert found[1].step > first.step


def test_a_jump_that_keeps_climbing_is_caught() -> None:
    rng = np.random.default_rng(1)
    before = 0.4 * np.exp(rng.normal(0, 0.4, 200))
    after = 3e3 * 1.3 ** np.arange(30) * np.exp(rng.normal(0, 0.6, 30))  # up and down
    found = _found(np.concatenate([before, after]))
    assert found and found[0].evidence.rule == "sustained"
    assert 200 <= found[0].step <= 204


def _noisy_batch_size_1(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.chisquare(1, n) * np.linspace(1.0, 0.1, n)  # squared error of one sample


def _warmup_cosine(rng: np.random.Generator, n: int) -> np.ndarray:
    t = np.arange(n)
    lr = np.minimum(1.0, t / 200) * 0.5 * (1 + np.cos(np.pi * t / n))
    level = 2.3 * np.exp(-np.cumsum(lr) / 300) + 0.01
    bump = 1 + 3 * np.exp(-(((t - 150) / 20) ** 2))  # the loss rises for a while in warm-up
    return level * bump * np.exp(rng.normal(0, 0.3, n))


def _sgdr(rng: np.random.Generator, n: int) -> np.ndarray:
    out, level = [], 2.3
    for t in range(n):
        phase = t % 500
        if phase == 0 and t:
            level = min(2.5, level * 300)  # the restart: back up 300x, not beyond the start
        level *= math.exp(-0.02 * (0.5 - 0.5 * math.cos(math.pi * phase / 500)))
        out.append(level * math.exp(rng.normal(0, 0.5)))
    return np.array(out)


def _heavy_tailed(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.exp(rng.normal(0, 1.5, n)) * np.linspace(2.0, 0.05, n)


def _spikes(rng: np.random.Generator, n: int) -> np.ndarray:
    loss = 0.5 * np.exp(rng.normal(0, 0.2, n))
    loss[rng.integers(0, n, 10)] *= 1e4  # single bad batches, 10^4x
    loss[700:702] *= 1e3  # two in a row
    return loss


@pytest.mark.parametrize(
    "curve", [_noisy_batch_size_1, _warmup_cosine, _sgdr, _heavy_tailed, _spikes]
)
def test_healthy_curves_raise_nothing(curve) -> None:  # type: ignore[no-untyped-def]
    for seed in range(40):
        loss = curve(np.random.default_rng(seed), 3000)
        found = _found(loss)
        assert not found, (curve.__name__, seed, found[0].summary)


@pytest.mark.parametrize("name", sorted(CURVES))
def test_real_curves(name) -> None:  # type: ignore[no-untyped-def]
    curve = CURVES[name]
    found = _found(curve["loss"], steps=curve["steps"])
    expected = curve["diverging_by"]
    if expected is None:
        assert not found, found[0].summary
    else:
        assert found and found[0].step <= expected, [d.step for d in found]


def test_losses_at_or_below_zero_and_short_runs() -> None:
    assert not _found([1.0, 2.0, 3.0])
    assert not _found(-np.exp(np.arange(50.0)))  # a negative log-likelihood falling forever
    assert not _found([0.0] * 20 + [1.0] * 20)


def test_a_million_steps_are_judged_fast() -> None:
    import time

    inputs = series_inputs(_noisy_batch_size_1(np.random.default_rng(0), 1_000_000) + 0.01)
    start = time.perf_counter()
    assert not divergence.diagnose(inputs)
    assert time.perf_counter() - start < 2.0  # the doctor runs it once a second


def test_a_long_run_is_judged_against_its_whole_history() -> None:
    # 60,000 steps: only the newest are judged on each pass, the older ones summed up.
    rng = np.random.default_rng(5)
    n = 60_000
    loss = _sgdr(rng, n)  # the highest level (the start) lies far before the steps judged
    assert not _found(loss)
    climb = loss.copy()
    climb[55_000:] = loss[54_999] * 3.0 ** np.arange(1, 5_001, dtype=float).clip(max=60)
    found = _found(_overflowing(climb))
    assert found and 55_000 <= found[0].step <= 55_007
    # A rise after a restart that passes the recent levels but not the start's stays quiet.
    restart = loss.copy()
    restart[58_000:58_050] = 2.0  # back to about where the run began
    assert not _found(restart)


@pytest.mark.parametrize("seed", range(6))
def test_judging_only_the_newest_steps_finds_what_judging_all_would(seed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    n = 45_000
    curve = [_noisy_batch_size_1, _warmup_cosine, _sgdr, _heavy_tailed, _spikes][seed % 5]
    loss = curve(rng, n)
    if seed % 2:  # and a climb among the newest steps, of a random rate
        at = int(rng.integers(n - 15_000, n - 100))
        rate = float(rng.uniform(1.3, 20))
        loss[at:] = loss[at - 1] * rate ** np.minimum(np.arange(1, n - at + 1), 60.0)
    windowed = [(d.step, d.severity) for d in _found(loss)]
    monkeypatch.setattr(divergence, "SCAN", 10**9)
    assert windowed == [(d.step, d.severity) for d in _found(loss)]
    assert bool(windowed) == bool(seed % 2)


def test_median5_summary_matches_the_whole_computation() -> None:
    from torchdoctor.diagnose.series import median5, median5_summary

    for seed in range(5):
        values = np.random.default_rng(seed).integers(0, 50, 200_000).astype(float)
        smoothed = median5(values)
        best_at = int(smoothed.size - 1 - np.nanargmin(smoothed[::-1]))
        expected = (
            float(smoothed[best_at]),
            best_at,
            float(np.nanmax(smoothed[: best_at + 1])),
            float(np.nanmax(smoothed)),
        )
        assert median5_summary(values) == expected
    assert median5_summary(np.array([1.0, 2.0])) is None
