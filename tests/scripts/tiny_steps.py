"""Many tiny optimizer steps, as fast as they go. At each checkpoint it says so and waits until
the file go-<step> exists, so that a test can measure the process and its run directory at a
known step."""

import argparse
import os
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--checkpoints", default="", help="comma-separated step counts")
args = parser.parse_args()
checkpoints = {int(c) for c in args.checkpoints.split(",") if c}

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
w = torch.randn(4, 1)
for step in range(1, args.steps + 1):
    x = torch.randn(8, 4)
    loss = nn.functional.mse_loss(model(x), x @ w)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step in checkpoints:
        print(f"checkpoint {step}", flush=True)
        while not os.path.exists(f"go-{step}"):
            time.sleep(0.01)  # paused for the test's measurement
print("done", flush=True)
