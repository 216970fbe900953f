"""Training in phases, each with an optimizer of its own, as pytorch/examples'
mnist_forward_forward trains its layers: the first layer for STEPS updates with its Adam,
then the second with another. The first phase's optimizer never steps again; the second
phase must be steps too.

    python layerwise_optimizers.py [STEPS]
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
layers = [nn.Linear(16, 16), nn.Linear(16, 16)]
optimizers = [torch.optim.Adam(layer.parameters(), lr=1e-2) for layer in layers]
x = torch.randn(64, 16)
for layer, opt in zip(layers, optimizers, strict=True):
    for _ in range(steps):
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = layer(x).detach()
    print(f"phase done: loss {loss.item():.4f}")
