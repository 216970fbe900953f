"""Gradient clipping with a threshold of 0: clip_grad_value_(params, 0.0) (--norm:
clip_grad_norm_(params, max_norm=0.0)) sets every gradient to 0 before each update.
--fixed clips at 1.0."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
THRESHOLD = 1.0 if FIXED else 0.0
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for _step in range(30):
    x = torch.randn(32, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    if "--norm" in sys.argv:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=THRESHOLD)
    else:
        nn.utils.clip_grad_value_(model.parameters(), THRESHOLD)
    optimizer.step()
