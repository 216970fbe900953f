"""optimizer.step() called before loss.backward() (zero_grad(), step(), forward, backward()):
each step() finds the gradients zero_grad() just cleared, so no weight ever moves, though
backward() computes gradients every step. --fixed steps after backward()."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for _step in range(30):
    x = torch.randn(32, 8)
    optimizer.zero_grad()
    if not FIXED:
        optimizer.step()
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    if FIXED:
        optimizer.step()
