"""Telemetry overhead, measured side by side in one run (instrumented vs plain).

Budgets (docs/benchmarks.md): always-on telemetry <= 1% of the demo model's step time and <= 50 us
fixed cost per step on a tiny model; module tracing at the default period <= 2%; a GROUP BY
over 1M torch_trace rows <= 200 ms. Run: .venv/bin/python benchmarks/overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _interleave import interleave, plain
from _models import tiny_step, transformer_step
from _probe import bench_probe, recording

import torchdoctor
from torchdoctor import session as sessions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="fewer blocks (a smoke run)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the demo model there)")
    args = parser.parse_args()
    blocks = 6 if args.quick else args.blocks
    torch.set_num_threads(1)  # one core per process: steadier timings on a shared machine
    probe = bench_probe(trace_every=0)

    def instrumented(trace_every: int) -> AbstractContextManager[None]:
        return recording(probe, trace_every=trace_every)

    default_every = torchdoctor.Config().trace_every
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, {blocks} blocks per config"
    )

    step = transformer_step(device=args.device)
    if args.device != "cpu":
        step = transformer_step(batch=64, seq=256, device=args.device)
    t = interleave(
        step,
        {
            "plain": plain,
            "telemetry": lambda: instrumented(0),
            "tracing": lambda: instrumented(default_every),
        },
        blocks=blocks,
        steps_per_block=20,
    )
    always_on = t["telemetry"] / t["plain"]
    tracing = t["tracing"] / t["telemetry"]
    print(f"demo transformer step on {args.device}: plain {t['plain'] * 1e3:.2f} ms")
    print(f"  always-on telemetry ratio     {always_on:.4f}  (budget <= 1.01)")
    print(f"  tracing every {default_every} steps ratio   {tracing:.4f}  (budget <= 1.02)")
    print(f"  everything (defaults) ratio   {t['tracing'] / t['plain']:.4f}")

    tiny = tiny_step()
    t = interleave(tiny, {"plain": plain, "telemetry": lambda: instrumented(0)}, blocks, 300)
    fixed = (t["telemetry"] - t["plain"]) * 1e6
    print(f"tiny model step: plain {t['plain'] * 1e6:.0f} us")
    print(f"  fixed cost per step            {fixed:.1f} us  (budget <= 30 us)")
    print(f"  ratio                          {t['telemetry'] / t['plain']:.4f}")

    query_1m(probe)
    probe.stop()


def query_1m(probe: sessions.Session) -> None:
    from torchdoctor.cli.client import Address, ProbeClient
    from torchdoctor.registry import socket_path

    table = probe.tables["torch_trace"]
    modules = [
        f"encoder.layers.{i // 4}.{n}" for i, n in enumerate(["attn", "mlp", "norm1", "norm2"] * 8)
    ]
    rows = []
    n = 1_000_000
    for i in range(n):
        step = i // 1000
        rows.append(
            (
                step,
                modules[i % 32],
                "Linear",
                "forward" if i % 2 else "backward",
                1e-4,
                2**20 + i,
                2**21,
                0.0,
                2,
                0,
            )
        )
    table.extend(rows)
    client = ProbeClient(Address("bench", socket_path=str(socket_path(probe.pid))))
    sql = (
        "SELECT module, stage, COUNT(*) AS count, AVG(duration) AS avg_time, "
        "SUM(duration) AS total_time FROM python.torch_trace GROUP BY module, stage "
        "ORDER BY total_time DESC LIMIT 10"
    )
    client.request("POST", "/v1/query", {"sql": sql})  # first query: connect, seal
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        status, payload = client.request("POST", "/v1/query", {"sql": sql})
        times.append(time.perf_counter() - t0)
        assert status == 200 and len(payload["rows"]) == 10, payload
    median = statistics.median(times)
    print(f"GROUP BY over {n:,} torch_trace rows, round trip: median {median * 1e3:.1f} ms")
    print(f"  (budget <= 200 ms; ratio to budget {median / 0.2:.2f})")


if __name__ == "__main__":
    main()
