"""Telemetry overhead on a GPU, side by side in one run (instrumented vs plain): the demo
transformer at three sizes (launch-bound small steps, where host work shows, to a step with
real work on the device), and the tiny CPU model in a process that has initialized CUDA (it
must keep the CPU's path: docs/benchmarks.md, "GPU"). `--profile` adds where the host time of
200 instrumented small steps goes (cProfile: all threads on Python 3.12+).

    python benchmarks/gpu_overhead.py [--blocks N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _interleave import interleave, median_interval, plain
from _models import tiny_step, transformer_step
from _probe import bench_probe, recording

SIZES = ((16, 64), (64, 256), (256, 256))  # (batch, sequence) of the demo transformer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_overhead: skipped, no CUDA GPU here")
        return
    torch.set_num_threads(1)
    probe = bench_probe(trace_every=0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}, {args.blocks} blocks")

    torch.zeros(1, device="cuda")  # CUDA initialized, the model on the CPU
    tiny = tiny_step()
    # 8 blocks gave anything from 2 to 110 us on a lent H100 machine (docs/benchmarks.md,
    # "Third GPU session"): 24, with the ratio's interval printed beside it
    ratios: dict[str, list[float]] = {}
    t = interleave(
        tiny,
        {"plain": plain, "telemetry": lambda: recording(probe, trace_every=0)},
        24,
        300,
        ratios=ratios,
        clock=time.thread_time,
    )
    fixed = (t["telemetry"] - t["plain"]) * 1e6
    low, high = median_interval(ratios["telemetry"])
    print(f"tiny CPU model beside an initialized GPU: plain {t['plain'] * 1e6:.0f} us, ", end="")
    print(f"fixed cost {fixed:.1f} us (ratio {t['telemetry'] / t['plain']:.3f}, ", end="")
    print(f"95% interval {low:.3f}-{high:.3f})")

    for batch, seq in SIZES:
        step = transformer_step(batch=batch, seq=seq, device="cuda")
        t = interleave(
            step,
            {
                "plain": plain,
                "telemetry": lambda: recording(probe, trace_every=0),
                "tracing": lambda: recording(probe, trace_every=20),
            },
            blocks=args.blocks,
            steps_per_block=20,
        )
        print(
            f"transformer batch {batch} x {seq}: plain {t['plain'] * 1e3:.2f} ms, "
            f"always-on {t['telemetry'] / t['plain']:.4f}, "
            f"tracing every 20 on top {t['tracing'] / t['telemetry']:.4f}",
            flush=True,
        )

    if args.profile:
        step = transformer_step(batch=SIZES[0][0], seq=SIZES[0][1], device="cuda")
        with recording(probe, trace_every=0):
            for _ in range(30):
                step()
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(200):
                step()
            profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumtime").print_stats("torchdoctor", 25)
        print(out.getvalue())
    probe.stop()


if __name__ == "__main__":
    main()
