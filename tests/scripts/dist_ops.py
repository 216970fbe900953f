"""Two spawned gloo ranks call most of torch.distributed's collectives and point-to-point ops
once or twice each, on the default group and on a subgroup: what python.collectives must record
the same way with either kernel (tests/integration/test_collectives.py)."""

from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(x)
    dist.broadcast(x, src=1)
    dist.reduce(x, dst=0)
    gathered = [torch.empty(4) for _ in range(2)]
    dist.all_gather(gathered, x)
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(torch.empty(8), x)
    dist.gather(x, gathered if rank == 0 else None, dst=0)
    dist.scatter(x, [torch.ones(4), torch.zeros(4)] if rank == 1 else None, src=1)
    dist.barrier()
    ints = torch.tensor([rank, 7], dtype=torch.int64)
    if rank == 0:  # point to point, numbered per peer: two sends each way
        dist.send(ints, dst=1)
        dist.recv(ints, src=1)
        dist.isend(torch.ones(3, dtype=torch.float64), dst=1).wait()
    else:
        dist.recv(ints, src=0)
        dist.send(ints, dst=0)
        dist.irecv(torch.empty(3, dtype=torch.float64), src=0).wait()
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2, 3), group=sub)
    dist.all_reduce(x, async_op=True).wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port,), nprocs=2, join=True)
    sys.stdout.write("done\n")
