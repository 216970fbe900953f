"""The dormant cost of NaN detection, against torch.autograd.detect_anomaly, side by side.

torchdoctor's check is the loss value and the total gradient norm per step (plus --guard's
skip, which costs nothing until it fires); localization replays a step only after one went
non-finite. Anomaly mode records a traceback for every op and checks every backward result.
Budget: the guard within the telemetry budget (<= 1% of step time).
Run: .venv/bin/python benchmarks/nan_guard.py
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _interleave import interleave, plain
from _models import transformer_step
from _probe import bench_probe, recording


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    probe = bench_probe(trace_every=0, guard=True)

    def guard() -> AbstractContextManager[None]:
        return recording(probe)

    @contextlib.contextmanager
    def anomaly() -> Iterator[None]:
        with torch.autograd.detect_anomaly(check_nan=True):
            yield

    step = transformer_step()
    t = interleave(step, {"plain": plain, "guard": guard, "anomaly": anomaly}, args.blocks, 20)
    print(f"demo transformer step: plain {t['plain'] * 1e3:.2f} ms")
    print(
        f"  torchdoctor NaN guard (dormant) ratio  {t['guard'] / t['plain']:.4f}  (budget <= 1.01)"
    )
    print(f"  torch.autograd.detect_anomaly ratio    {t['anomaly'] / t['plain']:.4f}")
    probe.stop()


if __name__ == "__main__":
    main()
