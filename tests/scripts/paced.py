"""A small training loop that keeps a steady pace and prints each step's wall-clock time, so a
test can tell whether anything slowed it down. Stops when the file `stop` exists."""

import os
import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 1)
while not os.path.exists("stop"):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"t {time.time():.6f}", flush=True)
    time.sleep(0.01)
