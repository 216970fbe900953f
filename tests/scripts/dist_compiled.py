"""A DDP model under torch.compile (backend "aot_eager": no compiler needed on CPU), for
tests/integration/test_collectives.py: the script prints the same under torchdoctor (torch
warns when a compiled module meets global module hooks: there must be none of ours then), and
the graph break its forward has is named at this file's line, not in DDP's code.

    torchrun --nproc-per-node 2 dist_compiled.py
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.sum().item() > 1e9:  # a graph break: .item() inside the compiled forward
            h = h / 2
        return self.b(h)


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(Net())
compiled = torch.compile(model, backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(dist.get_rank())
for _ in range(6):
    x = torch.randn(4, 8, generator=generator)
    y = torch.randn(4, 1, generator=generator)
    loss = ((compiled(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
# one write per line: torchrun runs the ranks unbuffered (-u), and print() writes its text and
# its newline apart, so two ranks' lines could mix in the shared pipe
sys.stdout.write(f"rank {dist.get_rank()} loss {loss.item():.6f}\n")
sys.stdout.flush()
dist.destroy_process_group()
