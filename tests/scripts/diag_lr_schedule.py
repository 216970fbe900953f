"""An RNN regressor whose StepLR multiplies the learning rate by 10 every 15 steps (gamma
was meant to be 0.1): gradients explode, then the loss diverges.
--fixed uses gamma=0.1 and clips gradients."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Forecaster(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


model = Forecaster()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=15, gamma=0.1 if FIXED else 10.0)
for _step in range(75):
    x = torch.randn(32, 20, 4)
    y = x[:, -5:, :2].sum((1, 2)).unsqueeze(1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    if FIXED:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    if not torch.isfinite(loss):
        break
