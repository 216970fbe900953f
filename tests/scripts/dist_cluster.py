"""A small DDP job (gloo) with one planted multi-rank problem: the job behind the cluster tests.

    torchrun --nproc_per_node=N dist_cluster.py MODE[,MODE...] [--fixed] [--linger | --linger0]
        [--timeout SECONDS] [--end barrier|all_reduce|broadcast]

MODE:
  stuck      the last rank's data read never returns at step 5 while the others wait in DDP's
             gradient all-reduce (--fixed: it returns)
  uneven     each rank takes its own slice of 4 * steps * ranks + 1 samples (batches of 4)
             without a DistributedSampler: the last rank has one batch fewer, leaves its loop
             and writes a checkpoint while rank 0 waits (--fixed: DistributedSampler)
  mismatch   only rank 0 all-reduces its loss for logging at step 3: gloo pairs it with rank
             1's gradient all-reduce and the job dies (--fixed: every rank does)
  straggler  the last rank's batches take 40 ms longer to load (--fixed: no delay)
  lost       the last rank is killed with SIGKILL at step 5 (as by the kernel's OOM killer):
             the others lose their peer in the gradient all-reduce
  raised     the last rank starts a non-daemon thread (an uploader that waits for `stop`) and
             raises at step 5: its process stays alive while the others wait in the all-reduce
  drift      at step 2 the last rank changes one weight of its copy of the model in place:
             the replicas drift apart (--fixed: every rank makes the same change)
  all        stuck, uneven, mismatch and straggler (with --fixed: every one of their fixes)
--linger: every rank waits for the file `stop` after its loop (a slow final checkpoint);
--linger0: rank 0 only, the others exit. A read or a checkpoint that never ends waits for it too.
--timeout: the process group's timeout (default 600 s).
--end: with `uneven`, every rank calls this collective after its loop (a barrier, a final
all_reduce of a metric, a checkpoint's broadcast from rank 0) instead of lingering.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

MODES = sys.argv[1].split(",")
FIXED = "--fixed" in sys.argv
BUGS = {"stuck", "uneven", "mismatch", "straggler"} if "all" in MODES else set(MODES)
LENGTH = {"stuck": 12, "uneven": 5, "mismatch": 8, "straggler": 30, "all": 12, "lost": 12}
STEPS = max(LENGTH.get(m, 12) for m in MODES)


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


TIMEOUT = float(option("--timeout", "600"))
END = option("--end", "")


def bug(name: str) -> bool:
    return name in BUGS and not FIXED


class Samples(Dataset):
    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i]


def upload_logs() -> None:
    while not os.path.exists("stop"):  # a non-daemon uploader thread
        time.sleep(0.05)


def load_batch(batches, step: int, rank: int) -> torch.Tensor:
    last = rank == dist.get_world_size() - 1
    if bug("stuck") and last and step == 5:
        while not os.path.exists("stop"):  # the read that never returns
            time.sleep(0.05)
    if bug("lost") and last and step == 5:
        # Killed while the others wait in this step's all-reduce (as the kernel's OOM killer
        # does): torchrun stops the job within 0.1 s of the death, and on a loaded machine a
        # rank can take longer than that to reach the all-reduce, so the death waits a moment.
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    if bug("raised") and last and step == 5:
        raise ValueError(f"corrupt record in shard {rank}")  # the bug
    return next(batches)


def save_checkpoint(model: nn.Module, linger: bool) -> None:
    torch.save(model.state_dict(), f"model{dist.get_rank()}.pt")
    while linger and not os.path.exists("stop"):  # a large checkpoint, slow storage
        time.sleep(0.05)


def after_loop(model: nn.Module, rank: int) -> None:
    """The collective every rank calls after its loop (--end)."""
    if END == "barrier":
        dist.barrier()
    elif END == "all_reduce":
        total = torch.zeros(3)  # a final metric
        dist.all_reduce(total)
    elif END == "broadcast":  # rank 0's checkpoint sent to every rank
        state = [model.state_dict() if rank == 0 else None]
        dist.broadcast_object_list(state, src=0)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
    rank, world = dist.get_rank(), dist.get_world_size()
    if bug("raised") and rank == world - 1:
        threading.Thread(target=upload_logs, name="uploader").start()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    delay = 0.01 if bug("straggler") and rank == world - 1 else 0.0
    if "uneven" in BUGS:
        data = Samples(4 * STEPS * world + 1, delay)
        if FIXED:
            loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
        else:
            mine = torch.utils.data.Subset(data, range(rank, len(data), world))  # the bug
            loader = DataLoader(mine, batch_size=4)
        batches = iter(loader)
        steps = len(loader)
    else:
        loader = DataLoader(Samples(4 * STEPS, delay), batch_size=4)
        batches, steps = iter(loader), STEPS
    for step in range(steps):
        x = load_batch(batches, step, rank)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if "drift" in BUGS and step == 2 and (rank == world - 1 or FIXED):
            with torch.no_grad():  # the bug: one rank's copy only
                model.module[0].weight[0, 0] += 1e-3
        if "mismatch" in BUGS and step == 3 and (rank == 0 or FIXED):
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # the bug: only rank 0 gets here
    if END:
        after_loop(model, rank)
    linger = "--linger" in sys.argv or (rank == 0 and "--linger0" in sys.argv)
    linger = linger or (bug("uneven") and not END)
    save_checkpoint(model, linger)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
