"""A learning-rate schedule that never reaches the optimizer that trains:
  (default)  the optimizer is re-created (after loading a checkpoint) once the scheduler was
             built: the scheduler steps the old one
  --never    the scheduler is built and never stepped
--fixed builds the scheduler from the optimizer that steps, and steps it each epoch."""

import sys
import warnings

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
NEVER = "--never" in sys.argv and not FIXED
warnings.filterwarnings("ignore", message="Detected call of")  # torch's hint, often unseen
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.7)
state = optimizer.state_dict()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # "resumed"
optimizer.load_state_dict(state)
if FIXED:
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.7)
data = torch.utils.data.TensorDataset(torch.randn(80, 10), torch.randn(80, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
for _epoch in range(6):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if not NEVER:
        scheduler.step()
