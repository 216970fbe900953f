"""DistributedDataParallel on gloo with two processes from torch.multiprocessing.spawn (the
pattern of pytorch/examples distributed/ddp), each rank writing its losses to its own file
(printed, the two ranks' lines would interleave differently from run to run)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import seed
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def run(rank: int, world: int, port: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    seed()
    model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    log = open(f"rank{rank}.log", "w")  # noqa: SIM115
    for step in range(5):
        x, y = torch.randn(8, 6), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log.write(f"step {step} loss {loss.item().hex()}\n")
    log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2, sys.argv[1]), nprocs=2, join=True)
