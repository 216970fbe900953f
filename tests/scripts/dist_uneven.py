"""Two ranks (gloo) that all-reduce their loss each step. Rank 1's shard is shorter: it
finishes early and goes on to "save a checkpoint" while rank 0 waits in all_reduce forever.
--fixed gives both ranks the same number of steps (drop_last-style)."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

FIXED = "--fixed" in sys.argv
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 8 if (FIXED or rank == 0) else 5
for _step in range(steps):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    report = loss.detach().clone()
    dist.all_reduce(report)
if rank == 1 and not FIXED:
    time.sleep(600)  # writing a large checkpoint, while rank 0 waits
dist.destroy_process_group()
