"""A fast training loop that sets every gradient to None at each step (zero_grad with
set_to_none), with enough parameters that scanning them takes a while. While the file `stall`
exists it stops stepping (as a hung collective would); the file `stop` ends it."""

import os
import time

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(16)])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(4, 8)
step = 0
while not os.path.exists("stop"):
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()
    step += 1
    if os.path.exists("stall"):
        print("stalled", flush=True)
        while os.path.exists("stall"):
            time.sleep(0.01)
print(f"{step} steps", flush=True)
