"""Planted: the head reads a detached copy of the encoder's output, so the encoder never
receives a gradient."""

import torch
from torch import nn

torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(x).detach()  # meant for a logging hook, left in the path
        return self.head(features)


model = Model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(30):
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
