"""A tabular regression whose data set has a missing value read as NaN at one row.
--fixed drops rows that are not finite."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
features = torch.randn(640, 12)
target = features[:, :3].sum(1, keepdim=True)
features[333, 5] = float("nan")  # an empty cell in the CSV
if FIXED:
    keep = torch.isfinite(features).all(1)
    features, target = features[keep], target[keep]
loader = DataLoader(TensorDataset(features, target), batch_size=32, shuffle=False)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
