"""A small CNN whose head computes log(softmax(x)) by hand. One batch carries very bright
images: a logit dominates, softmax underflows to 0 for the rest, log(0) = -inf.
--fixed uses F.log_softmax."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class LogProbHead(nn.Module):
    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fc(x)
        if FIXED:
            return nn.functional.log_softmax(logits, dim=-1)
        return torch.log(torch.softmax(logits, dim=-1))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()
        )
        self.head = LogProbHead(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(25):
    x = torch.rand(16, 1, 16, 16)
    if step == 9:
        x = x * 5000.0  # an over-exposed batch
    y = torch.randint(0, 10, (16,))
    loss = nn.functional.nll_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
