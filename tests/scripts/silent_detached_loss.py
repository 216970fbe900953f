"""The model's output detached "to save memory" before the loss; backward() then complained
that the loss does not require grad, so the script made it require grad: backward() now runs
and the model gets no gradient at all.
--fixed keeps the output attached."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _step in range(30):
    x = torch.randn(32, 8)
    out = model(x)
    if not FIXED:
        out = out.detach()
    loss = nn.functional.mse_loss(out, x.sum(1, keepdim=True))
    if not FIXED:
        loss.requires_grad_(True)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
