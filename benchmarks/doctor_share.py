"""The doctor thread's share of a core as a run grows, on a tiny fast model (the worst case:
many steps per second, so the tables the doctor reads every pass grow fastest).

Its passes read whole tables; it holds the GIL while it works, so its CPU time is time the
training thread may lose. doctor.py spaces its passes so the share stays at about 1% (SHARE).
Prints, per window: steps so far, the doctor's CPU seconds in the window and its share, and the
step time. Run: .venv/bin/python benchmarks/doctor_share.py [--windows N] [--seconds S]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import torch
from torch import nn

import torchdoctor


def cpu_seconds(name: str) -> float:
    """CPU time (user + system) of the thread called `name`, from /proc."""
    for thread in threading.enumerate():
        if thread.name == name:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / 100  # clock ticks of 10 ms
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a window")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    probe = torchdoctor.start(run_dir=tempfile.mkdtemp(prefix="td-bench-"), quiet=True)
    steps = 0
    print(f"torch {torch.__version__}, tiny MLP, {args.windows} windows of {args.seconds:g} s")
    for _ in range(args.windows):
        before, t0, n = cpu_seconds("torchdoctor-doctor"), time.perf_counter(), 0
        while time.perf_counter() - t0 < args.seconds:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += 1
        spent = cpu_seconds("torchdoctor-doctor") - before
        steps += n
        print(
            f"steps so far {steps:8d}   doctor {spent:5.2f} s CPU ({spent / args.seconds:5.1%})"
            f"   step {args.seconds / n * 1e6:6.0f} us"
        )
    probe.stop()


if __name__ == "__main__":
    main()
