"""Side-by-side timing in one process: blocks of steps alternate between configurations, so
machine noise hits every configuration alike. Ratios of medians are what we report."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager


def per_step_times(
    step: Callable[[], object], n: int, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    out = []
    for _ in range(n):
        t0 = clock()
        step()
        out.append(clock() - t0)
    return out


def interleave(
    step: Callable[[], object],
    configs: dict[str, Callable[[], AbstractContextManager[object]]],
    blocks: int,
    steps_per_block: int,
    warmup: int = 20,
    ratios: dict[str, list[float]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median step time (seconds) per configuration: each config is a context manager factory
    under which `step` runs. The first configuration is the baseline: each other one is
    reported as the baseline's median times the median of its per-round ratios to the
    baseline, so slow drift of the machine cancels out round by round. `ratios`, if given,
    receives each configuration's per-round ratios; `clock` what is timed (time.thread_time: the
    training thread's CPU time, which other processes' load changes less)."""
    for make in configs.values():
        with make():
            per_step_times(step, warmup)
    times: dict[str, list[float]] = {name: [] for name in configs}
    for block in range(blocks):
        order = list(configs) if block % 2 == 0 else list(reversed(configs))
        for name in order:
            with configs[name]():
                times[name].append(statistics.median(per_step_times(step, steps_per_block, clock)))
    base_name = next(iter(configs))
    base = times[base_name]
    out = {base_name: statistics.median(base)}
    for name, values in times.items():
        if name != base_name:
            per_round = [v / b for v, b in zip(values, base, strict=True)]
            if ratios is not None:  # the caller wants the spread too
                ratios[name] = per_round
            out[name] = out[base_name] * statistics.median(per_round)
    return out


def median_interval(
    values: list[float], level: float = 0.95, draws: int = 2000
) -> tuple[float, float]:
    """Bootstrap interval of the median of `values` (per-round ratios): how far the reported
    median may be from the machine's true one, given the rounds' spread."""
    rng = random.Random(0)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(draws))
    cut = int(draws * (1 - level) / 2)
    return medians[cut], medians[draws - 1 - cut]


class _Plain:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def plain() -> AbstractContextManager[object]:
    return _Plain()
