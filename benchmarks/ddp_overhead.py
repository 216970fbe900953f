"""Cost of collective tracing (python.collectives) on a 2-rank gloo DDP job, paired in one run.

Each rank runs the full probe; blocks of steps alternate between the c10d kernels registered
(every all-reduce recorded and written through to the run directory) and dropped, in the same
order on both ranks. Reported: rank 0's median step time untraced and the median of the
per-round ratios traced/untraced. Budget (docs/benchmarks.md): <= 1.01.

    .venv/bin/python benchmarks/ddp_overhead.py [--blocks N] [--width W]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _interleave import interleave
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchdoctor
from torchdoctor.telemetry import collectives


@contextlib.contextmanager
def kernels(on: bool) -> Iterator[None]:
    collectives.set_kernels(on)
    try:
        yield
    finally:
        collectives.set_kernels(True)


def rank_main(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    probe = torchdoctor.start(run_dir=tempfile.mkdtemp(prefix="td-ddp-bench-"), quiet=True)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    w = args.width
    model = DistributedDataParallel(  # DDP's default 25 MB buckets
        nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1)),
        bucket_cap_mb=args.bucket_mb,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(args.batch, w), torch.randn(args.batch, 1)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        report = loss.detach()
        dist.all_reduce(report)  # the script's own: the logged mean loss

    t = interleave(
        step,
        {"untraced": lambda: kernels(False), "traced": lambda: kernels(True)},
        blocks=args.blocks,
        steps_per_block=args.steps,
    )
    calls = len(probe.tables["collectives"])
    if rank == 0:
        Path(out).write_text(f"{t['untraced']} {t['traced']} {calls}\n")
    dist.destroy_process_group()
    probe.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    args = parser.parse_args()
    os.environ.setdefault("TORCHDOCTOR_SOCKET_DIR", tempfile.mkdtemp(prefix="td-"))
    with socket_port() as port, tempfile.NamedTemporaryFile() as out:
        mp.spawn(rank_main, args=(args, port, out.name), nprocs=2, join=True)
        untraced, traced, calls = Path(out.name).read_text().split()
    base, ratio = float(untraced), float(traced) / float(untraced)
    steps = args.blocks * args.steps + 20  # the traced blocks and the warm-up
    print(f"torch {torch.__version__}, gloo, 2 ranks, {args.blocks} blocks x {args.steps} steps")
    print(f"untraced step (rank 0, median): {base * 1e3:.2f} ms")
    print(f"collective tracing, traced/untraced (paired): {ratio:.4f}   budget <= 1.01")
    print(f"collectives recorded on rank 0: {calls} ({int(calls) / steps:.1f} per step)")


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


if __name__ == "__main__":
    main()
