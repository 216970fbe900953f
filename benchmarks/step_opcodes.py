"""Where the fixed cost of a step goes, counted rather than timed: the Python opcodes each
function runs per step of the tiny CPU model, plain and under torchdoctor (sys.settrace with
opcode events). Counts are the same on a loaded machine as on an idle one, so a change to the
hot path can be judged here when timings are noise; benchmarks/overhead.py gives the time.

    .venv/bin/python benchmarks/step_opcodes.py [--steps N] [--top K]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _models import tiny_step
from _probe import bench_probe, recording


def _where(code: Any) -> str:
    path = code.co_filename
    if "/torchdoctor/" in path:
        return "torchdoctor " + path.split("/torchdoctor/", 1)[1] + ":" + code.co_name
    if "/torch/" in path:
        return "torch " + path.split("/torch/", 1)[1] + ":" + code.co_name
    return Path(path).name + ":" + code.co_name


def count(step: Any, steps: int) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        where = _where(frame.f_code)

        def on_opcode(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[where] += 1
            return on_opcode

        return on_opcode

    sys.settrace(on_call)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.settrace(None)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tiny = tiny_step()
    for _ in range(50):
        tiny()
    plain = count(tiny, args.steps)
    probe = bench_probe(trace_every=0)
    with recording(probe, trace_every=0):
        for _ in range(50):
            tiny()
        probed = count(tiny, args.steps)
    probe.stop()
    n = args.steps
    ours = {k: v for k, v in probed.items() if k.startswith("torchdoctor ")}
    torch_plain = sum(v for k, v in plain.items() if k.startswith("torch "))
    torch_probed = sum(v for k, v in probed.items() if k.startswith("torch "))
    print(f"Python opcodes per step of the tiny model ({n} steps counted)")
    print(f"  plain:                 {sum(plain.values()) / n:8.0f}")
    print(f"  under torchdoctor:     {sum(probed.values()) / n:8.0f}")
    print(f"    torchdoctor's own:   {sum(ours.values()) / n:8.0f}")
    print(f"    torch's, more by:    {(torch_probed - torch_plain) / n:8.0f}  (its hook paths)")
    print(f"the {args.top} costliest functions of torchdoctor's, opcodes per step:")
    for where, total in sorted(ours.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {total / n:7.1f}  {where.removeprefix('torchdoctor ')}")


if __name__ == "__main__":
    main()
