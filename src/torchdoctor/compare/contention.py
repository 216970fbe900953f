"""What a busy machine may have done to each run's step times, from meta.json's `machine`
(run_setup.py): the scheduler's count of how long the main thread waited, runnable, for a CPU
(from the end of the first step, the steps' own share, where the run recorded it), and the
machine's load.

A step's wall time is the time its code ran on a CPU, the time it waited for something (data,
the GPU, a sleep) and the time it waited for a CPU while other processes had them: the last is
the machine's doing. A run whose main thread waited a share w of its time for a CPU has its
CPU-bound work stretched by up to 1 / (1 - w). So when B waited more than A, the machine alone
can make B's steps up to (1 - wA) / (1 - wB) times longer (all of their time being CPU-bound
at most), and a slowdown is real only beyond that, times the usual noise floor; the same
the other way round for a speed-up. Two identical runs on a loaded machine, one of which got
less CPU, then read as what they are; a planted slowdown that waits (a sleep, I/O) still
stands out. Without the figures (another system, a live run, an older run) the step times
are judged as measured, and the comparison says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.compare.stats import Change

MIN_APART = 0.05  # waiting shares this far apart are worth saying
MIN_WALL = 0.1  # seconds between the two readings: fewer say nothing


def waiting_share(meta: dict[str, Any]) -> float | None:
    """The share of the run's wall time its main thread spent waiting for a CPU: from the end
    of its first step where recorded (the steps compared, not the imports before them)."""
    m = meta.get("machine")
    if not isinstance(m, dict):
        return None
    start, last = m.get("steps") or m.get("start") or {}, m.get("last") or {}
    try:
        wall = float(last["time"]) - float(start["time"])
        wait = float(last["wait"]) - float(start["wait"])
    except (KeyError, TypeError, ValueError):
        return None
    if wall <= MIN_WALL or wait < 0:  # one write only (a live run), or a clock gone back
        return None
    return min(wait / wall, 0.99)


def load_per_cpu(meta: dict[str, Any]) -> float | None:
    """The machine's 1-minute load average per CPU, mean of the run's start and end."""
    m, cpus = meta.get("machine"), meta.get("cpus")
    if not isinstance(m, dict) or not isinstance(cpus, int) or cpus <= 0:
        return None
    loads = [(m.get(k) or {}).get("load") for k in ("start", "last")]
    values = [float(v) for v in loads if isinstance(v, (int, float))]
    return sum(values) / len(values) / cpus if values else None


def allowed(wa: float | None, wb: float | None) -> tuple[float, float]:
    """How much longer (first) or shorter (second) B's steps may be than A's from the
    difference in waiting for a CPU alone, as factors >= 1."""
    if wa is None or wb is None:
        return 1.0, 1.0
    return max(1.0, (1 - wa) / (1 - wb)), max(1.0, (1 - wb) / (1 - wa))


def judge(step: Change, wa: float | None, wb: float | None) -> Change:
    """`step` judged again, a slowdown real only beyond what the wait for a CPU allows."""
    up, down = allowed(wa, wb)
    if step.low is None or step.high is None or (up, down) == (1.0, 1.0):
        return step
    beyond = step.low > (1 + step.floor) * up or step.high < 1 / ((1 + step.floor) * down)
    return dataclasses.replace(step, real=step.real and beyond)
