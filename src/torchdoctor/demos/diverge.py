"""Planted: a learning rate far too high for SGD with momentum, no warm-up, no clipping."""

import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
w = torch.randn(32, 1)
for step in range(200):
    x = torch.randn(64, 32) * 3
    y = x @ w
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.4g}")
    time.sleep(0.05)  # a bigger model's step time: the alerts come while it runs
    if not torch.isfinite(loss):
        break
