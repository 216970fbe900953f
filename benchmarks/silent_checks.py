"""What the silent-error checks (telemetry/silent/) cost per step, measured side by side in one
process on the tiny CPU MLP of overhead.py, where a fixed cost shows the most.

Blocks of steps alternate between the telemetry with the checks switched off and with them on
(order reversed every round); each block installs a fresh Recorder, so its steps are numbered
from 0 and sampled as in a run (1-3, 50 and 51, then pairs paced to 1% of the training time:
telemetry/silent/pacing.py). Reported, in CPU time of the training thread (what other
processes' load does not change): the mean step over whole blocks (what a run of that many
steps pays, the sampled steps included: the first five are a fixed cost that a longer run
spreads thinner), the median (a step that is not sampled), a sampled step's own cost, and how
many steps of a block were sampled.

Run: .venv/bin/python benchmarks/silent_checks.py [--blocks N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _models import tiny_step
from _probe import bench_probe

from torchdoctor.telemetry.recorder import Recorder

# The training thread's CPU time: on a shared machine wall-clock times swing with other
# processes' load, while the work done in the training thread does not.
clock = time.thread_time


def block(probe, step, steps: int, checks: bool) -> tuple[list[float], list[bool]]:  # type: ignore[no-untyped-def]
    recorder = Recorder(probe)
    recorder.install()
    probe.telemetry = recorder
    if not checks:
        recorder.silent.switch.on = False
    times, sampled = [], []
    try:
        for _ in range(steps):
            sampled.append(recorder.silent.active)
            t0 = clock()
            step()
            times.append(clock() - t0)
    finally:
        recorder.remove()
        probe.telemetry = None
    return times, sampled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    probe = bench_probe(trace_every=0)
    step = tiny_step()
    for checks in (False, True):  # warm-up
        block(probe, step, 60, checks)
    means: dict[bool, list[float]] = {False: [], True: []}
    medians: dict[bool, list[float]] = {False: [], True: []}
    sampled_cost: list[float] = []
    counts: list[int] = []
    for b in range(args.blocks):
        for checks in (False, True) if b % 2 == 0 else (True, False):
            times, sampled = block(probe, step, args.steps, checks)
            times, sampled = times[1:], sampled[1:]  # step 0: discovery, in both
            means[checks].append(statistics.fmean(times))
            medians[checks].append(statistics.median(times))
            if checks:
                on = [t for t, s in zip(times, sampled, strict=True) if s]
                off = [t for t, s in zip(times, sampled, strict=True) if not s]
                sampled_cost.append(statistics.median(on) - statistics.median(off))
                counts.append(len(on))
    per_round_mean = [a - b for a, b in zip(means[True], means[False], strict=True)]
    per_round_median = [a - b for a, b in zip(medians[True], medians[False], strict=True)]
    base = statistics.median(means[False])
    print(f"torch {torch.__version__}, tiny MLP, {args.blocks} blocks of {args.steps} steps")
    print(f"  step with telemetry, checks off: mean {base * 1e6:.0f} us")
    print(
        f"  checks' cost per step, averaged over the run: "
        f"{statistics.median(per_round_mean) * 1e6:.1f} us (budget < 30 us)"
    )
    print(
        f"  on a step that is not sampled (medians): "
        f"{statistics.median(per_round_median) * 1e6:.1f} us"
    )
    print(f"  a sampled step's own extra cost: {statistics.median(sampled_cost) * 1e6:.0f} us")
    print(f"  sampled steps in a block of {args.steps}: {statistics.median(counts):.0f}")
    probe.stop()


if __name__ == "__main__":
    main()
