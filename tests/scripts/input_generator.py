"""A loop that draws its batches from a generator of its own, which gathers rows of an
in-memory tensor (no DataLoader); the gather is slow (--delay seconds of work a batch, done
in Python). Prints one JSON line: the seconds the loop spent waiting for each batch."""

import argparse
import json
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--delay", type=float, default=0.008)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(4096, 16)
Y = X @ torch.randn(16, 1)


def batches(size):
    while True:
        order = torch.randperm(len(X))
        for start in range(0, len(X) - size + 1, size):
            rows = order[start : start + size]
            deadline = time.perf_counter() + args.delay
            while time.perf_counter() < deadline:  # a transform in Python: busy, not asleep
                pass
            yield X[rows], Y[rows]


model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
waits = []
stream = batches(32)
for _ in range(args.steps):
    t0 = time.perf_counter()
    x, y = next(stream)
    waits.append(time.perf_counter() - t0)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(json.dumps({"fetch": waits}))
