"""A loop that takes its batch once, before the loop (meant to be inside it): the model sees
the same batch every step. --fixed fetches a batch every step."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.utils.data.TensorDataset(torch.randn(2000, 10), torch.randint(0, 3, (2000,)))
loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
batches = iter(loader)
x, y = next(batches)
for _step in range(55):
    if FIXED:
        x, y = next(batches)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
