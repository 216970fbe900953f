"""An embedding model trained with Adam(eps=0). Rows missing from the first batch get a zero
gradient: their update is 0/0 = NaN, and the next forward pass reads NaN weights.
--fixed keeps the default eps."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids).mean(1))


model = Bag()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 if FIXED else 0.0)
for _step in range(20):
    ids = torch.randint(0, 50, (16, 6))
    y = (ids.sum(1) % 2).long()
    loss = nn.functional.cross_entropy(model(ids), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
