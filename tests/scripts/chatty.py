"""A training loop that talks a lot: whole lines and partial lines on stdout and stderr, every
step, slowly enough for a status line to be drawn between them."""

import sys
import time

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(steps):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"out-line {step} loss {loss.item():.6f}")
    if step % 3 == 0:
        print(f"err-line {step}", file=sys.stderr)
    if step % 4 == 1:
        print(f"partial-{step} [", end="", flush=True)  # a line finished later
        time.sleep(pause)
        print("done]", flush=True)
    sys.stdout.flush()
    time.sleep(pause)
print("script finished")
