"""A warm-up schedule written as `step / warmup` with warmup counted in samples instead of
steps, truncated to an int: the learning rate stays 0 for the whole run.
--fixed computes the factor as a float over steps."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
warmup_samples = 50_000
warmup = 20 if FIXED else warmup_samples
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, (lambda s: min(1.0, (s + 1) / warmup)) if FIXED else (lambda s: min(1, s // warmup))
)
w = torch.randn(10, 1)
for _step in range(150):
    x = torch.randn(64, 10)
    loss = nn.functional.mse_loss(model(x), x @ w)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
