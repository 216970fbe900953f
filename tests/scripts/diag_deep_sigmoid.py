"""A 16-layer sigmoid MLP: each layer shrinks the gradient by up to 4x, so the first layers
receive almost none. --fixed uses ReLU with LayerNorm."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
layers: list[nn.Module] = []
for _ in range(16):
    layers.append(nn.Linear(32, 32))
    layers += [nn.LayerNorm(32), nn.ReLU()] if FIXED else [nn.Sigmoid()]
model = nn.Sequential(*layers, nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(30):
    x = torch.randn(64, 32)
    y = (x[:, 0] > 0).long()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
