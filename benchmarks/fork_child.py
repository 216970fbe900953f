"""A trainer forked from a probed process (torch.multiprocessing with fork, mnist_hogwild's
way), side by side with one forked from a plain process: the child's step time.

The child is not probed (it is no rank), so it must run at its plain speed: the fork handler
takes the parent's patches and torch hooks off in it (telemetry/patches.py, remove_in_fork).
Blocks alternate in one run: a child forked while a session runs, then one forked after it
stopped. Budget: ratio <= 1.01. Run: .venv/bin/python benchmarks/fork_child.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _models import tiny_step

import torchdoctor


def child_step_time(steps: int) -> float:
    """Seconds per step of the tiny MLP's training in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        step = tiny_step()
        for _ in range(50):
            step()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        os.write(write, repr((time.perf_counter() - start) / steps).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        return float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TORCHDOCTOR_SOCKET_DIR", tempfile.mkdtemp(prefix="td-"))
    ratios = []
    for _ in range(args.blocks):
        with torchdoctor.Session(tempfile.mkdtemp(prefix="td-fork-"), quiet=True):
            probed = child_step_time(args.steps)
        plain = child_step_time(args.steps)
        ratios.append(probed / plain)
        print(
            f"  child of a probed process {probed * 1e6:.0f} us, of a plain one "
            f"{plain * 1e6:.0f} us: {probed / plain:.3f}",
            flush=True,
        )
    print(
        f"forked trainer, step time ratio (median of {args.blocks}): "
        f"{statistics.median(ratios):.4f}  (budget <= 1.01)"
    )


if __name__ == "__main__":
    main()
