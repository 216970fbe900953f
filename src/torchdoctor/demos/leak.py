"""Planted: `history.append(loss)` keeps every loss tensor, and with it its step's graph,
whose saved activations `retain_graph=True` (added once to silence an error) keeps too."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
history = []
for step in range(160):
    x = torch.randn(128, 256)
    y = x[:, :10].argmax(dim=1)  # a learnable target
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
    history.append(loss)  # the leak: should be loss.item()
    if step % 40 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
