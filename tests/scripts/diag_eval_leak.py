"""Every step the loop also scores a validation batch and keeps the predictions for an
end-of-run report, without torch.no_grad(): each kept tensor holds its whole graph.
--fixed scores under torch.no_grad()."""

import contextlib
import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1),
    nn.ReLU(),
    nn.Conv2d(16, 16, 3, padding=1),
    nn.ReLU(),
    nn.AdaptiveAvgPool2d(4),
    nn.Flatten(),
    nn.Linear(256, 10),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
validation_predictions = []
val_x = torch.randn(64, 3, 32, 32)
for _step in range(120):
    x = torch.randn(32, 3, 32, 32)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad() if FIXED else contextlib.nullcontext():
        validation_predictions.append(model(val_x).softmax(-1))
