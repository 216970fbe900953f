"""A training loop that prints a table of its steps cell by cell (`print(..., end="")`), the
way progress tables are often written, and whose data turns to NaN at step 6. With a pause
inside each row (argv[1] seconds; argv[2] steps, 10 by default) the script spends its time in
the middle of a row: that is where the NaN is found."""

import math
import sys
import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0  # seconds in each row
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
print(f"{'step':>4} | {'loss':>8} | {'grad norm':>9}")
for step in range(steps):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    if step == 6:
        x[0, 0] = math.nan
    print(f"{step:>4} | ", end="", flush=True)  # the row begins before the step runs
    time.sleep(pause)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    optimizer.step()
    print(f"{loss.item():>8.4f} | {norm.item():>9.4f}", flush=True)
print("done")
