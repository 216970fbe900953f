"""A linear regression trained with a learning rate far too high: full-batch SGD whose error
is multiplied by about 3 each step, so the loss grows about tenfold a step from step 1 until
it overflows. --fixed uses a sane learning rate."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
x = torch.randn(512, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02 if FIXED else 2.1)
for step in range(80):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6g}")
    if not torch.isfinite(loss):
        break
