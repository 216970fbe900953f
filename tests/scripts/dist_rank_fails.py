"""A 2-rank gloo job under torchrun in which something goes wrong: the logs behind the
torchrun fixtures of `torchdoctor explain` (tests/fixtures/explain/*/torchrun_*.txt).

    torchrun --nproc_per_node=2 dist_rank_fails.py MODE [--record]

MODE: shape (rank 1 feeds a Linear the wrong width), oom (rank 1 fails with CUDA's
out-of-memory message), config (rank 1 fails with an error outside the catalog), mismatch
(rank 0 calls all_reduce while rank 1 calls broadcast: gloo times out on both), sizes (rank 1
all-reduces a tensor of another size: gloo aborts rank 0 with SIGABRT, rank 1 loses its peer),
killed (rank 1 dies of SIGKILL, as from the OOM killer: no traceback at all), ok (no error).
--record decorates the entry point with @record, so the traceback reaches the launcher's summary.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB "
    "of which 1.20 GiB is free. Of the allocated memory 75.10 GiB is allocated by PyTorch, and "
    "1.50 GiB is reserved by PyTorch but unallocated."
)


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank = dist.get_rank()
    model = torch.nn.Linear(784, 10)
    x = torch.randn(8, 784)
    if mode == "shape" and rank == 1:
        x = torch.randn(8, 512)  # the bug: this rank's data has another width
    if mode == "oom" and rank == 1:
        raise RuntimeError(OOM)
    if mode == "killed" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "config" and rank == 1:
        raise KeyError("optimizer.betas missing from config/train.yaml")
    out = model(x).sum().detach()
    if mode == "mismatch" and rank == 1:
        # The bug: rank 0 is in all_reduce meanwhile.
        dist.broadcast(out, src=0)
    elif mode == "sizes" and rank == 1:
        dist.all_reduce(torch.zeros(64))  # the bug: rank 0 all-reduces one element
    else:
        dist.all_reduce(out)
    print(f"rank {rank} done: {out.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    (record(main) if "--record" in sys.argv else main)()
