"""A per-epoch scheduler stepped at the start of each epoch, before any optimizer.step() (the
order before PyTorch 1.1): the first learning rate of the schedule is skipped.
--fixed steps it at the end of the epoch."""

import sys
import warnings

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
warnings.filterwarnings("ignore", message="Detected call of")  # as the original did
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
data = torch.utils.data.TensorDataset(torch.randn(160, 10), torch.randn(160, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
for _epoch in range(4):
    if not FIXED:
        scheduler.step()
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if FIXED:
        scheduler.step()
