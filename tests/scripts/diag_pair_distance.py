"""Metric learning: the distance between two embeddings is sqrt(sum((a-b)^2)). A batch that
pairs an item with itself gives distance 0: finite forward, infinite gradient of sqrt.
--fixed adds an epsilon inside the sqrt."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class PairDistance(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        squared = ((a - b) ** 2).sum(-1)
        return torch.sqrt(squared + 1e-12) if FIXED else torch.sqrt(squared)


class Siamese(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.tower = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
        self.distance = PairDistance()

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return self.distance(self.tower(self.embed(left)), self.tower(self.embed(right)))


model = Siamese()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(30):
    left = torch.randint(0, 100, (32,))
    right = (left + torch.randint(1, 100, (32,))) % 100  # a different item...
    if step >= 14:
        right[3] = left[3]  # sampling with replacement: an item paired with itself
    same = (left % 10 == right % 10).float()
    distance = model(left, right)
    loss = (same * distance**2 + (1 - same) * torch.relu(1.0 - distance) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
