"""A run that plateaus, then learns (word_language_model's first ~100 steps): the first shard
of the data has its targets shuffled away from their inputs, so for the first --plateau steps
there is nothing to learn; the real data follows and the loss falls. Each plateau step takes at
least --pace seconds (a slow first shard)."""

import argparse
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--plateau", type=int, default=200)
parser.add_argument("--steps", type=int, default=500)
parser.add_argument("--pace", type=float, default=0.01)
args = parser.parse_args()

torch.manual_seed(0)
w = torch.randn(10, 1)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(args.steps):
    x = torch.randn(64, 10)
    y = x @ w
    if step < args.plateau:
        y = y[torch.randperm(64)]  # the broken shard: targets of other rows
        time.sleep(args.pace)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.4f}")
