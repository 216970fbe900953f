"""A text-and-image model whose image tower runs under torch.no_grad() ("to save memory"),
although its parameters are trainable and in the optimizer.
--fixed lets gradients through."""

import contextlib
import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Sequential(nn.Embedding(200, 32), nn.Flatten(), nn.Linear(32 * 8, 64))
        self.image = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.fuse = nn.Linear(64 + 8, 2)

    def forward(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        with contextlib.nullcontext() if FIXED else torch.no_grad():
            seen = self.image(images)
        return self.fuse(torch.cat([self.text(tokens), seen], dim=1))


model = TwoTower()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(25):
    tokens = torch.randint(0, 200, (8, 8))
    images = torch.randn(8, 3, 12, 12)
    loss = nn.functional.cross_entropy(model(tokens, images), torch.randint(0, 2, (8,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
