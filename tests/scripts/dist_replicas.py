"""TrainCheck's distributed silent errors in one small gloo job (tests/integration/
test_cluster.py): four replicated models, each with one planted bug, and a healthy one; every
rank trains on batches of its own, as data parallelism does.

    torchrun --nproc_per_node=2 dist_replicas.py

  unwrapped  the training calls the module DistributedDataParallel wraps, not the wrapper
             (TrainCheck's DDP out of sync on the HF Trainer): no gradient is averaged
  moved      cast to float64 and back after DistributedDataParallel(model) was built
             (pytorch-104336 moved it to the CPU and back): DDP's gradient hooks stay on the
             old tensors, no gradient is averaged
  p2p        one weight of the last rank's copy zeroed after DDP was built, as by a
             device-to-device copy that returned zeros (pytorch-84803, pytorch-96600,
             baichuan2-86: peer-to-peer copies between GPUs that lose their data)
  clipped    gradients clipped by a norm that includes a rank-local shard, not all-reduced
             (deepspeed-1801: the BF16 optimizer's clipping under tensor parallelism, BLOOM-176B's
             layer norms out of sync): each rank scales its update by its own factor
  healthy    every fix at once: the wrapper called, the shard's norm all-reduced
After 6 steps (checked after 1, 2 and 4) every rank waits for the file `go`, then:
  moe        the last rank routes no token to its experts and skips the all_to_all that rank 0
             issues (deepspeed-5794: expert parallelism hangs at the last MoE layer); rank 0's
             all_to_all meets the last rank's gradient all-reduce
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
last = rank == world - 1
torch.manual_seed(0)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


unwrapped = mlp()
unwrapped_ddp = DDP(unwrapped)  # built, then not used: the bug
moved = DDP(mlp())
moved.module.double()  # the bug: cast (moved) after wrapping, as for a float64 evaluation
moved.module.float()
p2p = DDP(mlp())
if last:
    with torch.no_grad():  # the bug: a copy that came back as zeros on one rank
        p2p.module[0].weight.copy_(torch.zeros_like(p2p.module[0].weight))
clipped = DDP(mlp())
healthy = DDP(mlp())
# A rank-local shard beside each of the two clipped models (tensor parallelism's own slice).
shards = [nn.Parameter(torch.randn(16, generator=torch.Generator().manual_seed(rank + 7)))]
shards.append(nn.Parameter(shards[0].detach().clone()))
models = [unwrapped, moved, p2p, clipped, healthy]
params = [p for m in models for p in m.parameters()] + shards
optimizer = torch.optim.SGD(params, lr=0.05)


def clip(replicated: nn.Module, shard: nn.Parameter, all_reduced: bool) -> None:
    """Scale the gradients of a replicated model and its shard to a total norm of 0.1."""
    local = shard.grad.pow(2).sum()
    if all_reduced:
        dist.all_reduce(local)  # the fix: the shards' norm is the same on every rank
    total = (sum(p.grad.pow(2).sum() for p in replicated.parameters()) + local).sqrt()
    scale = torch.clamp(0.1 / (total + 1e-6), max=1.0)
    for p in [*replicated.parameters(), shard]:
        p.grad.mul_(scale)


generator = torch.Generator().manual_seed(rank + 1)  # every rank its own batches
for step in range(7):
    if step == 6:
        while not os.path.exists("go"):  # the test has read the drift findings
            time.sleep(0.05)
    x = torch.randn(4, 8, generator=generator)
    loss = sum(m(x).pow(2).mean() for m in models[:3])
    loss = loss + (clipped(x).squeeze(1) @ shards[0][:4]).pow(2)
    loss = loss + (healthy(x).squeeze(1) @ shards[1][:4]).pow(2)
    if step == 6:
        tokens = torch.arange(4, dtype=torch.float32) + rank
        if not last:  # the bug: a rank with no token for its experts skips the exchange
            routed = torch.empty(4)
            dist.all_to_all_single(routed, tokens)
    optimizer.zero_grad()
    loss.backward()
    clip(clipped, shards[0], all_reduced=False)  # the bug: a norm of this rank's own
    clip(healthy, shards[1], all_reduced=True)
    optimizer.step()
dist.destroy_process_group()
