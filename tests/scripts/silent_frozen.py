"""Transfer learning where the freezing loop freezes everything but the batch-norm layers,
the new classifier included (TrainCheck's pytorch-forum-84911: only the BN layers train).
--fixed freezes the backbone and trains the new classifier (a frozen backbone on purpose)."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self._fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self._fc(self.pool(x).flatten(1))


model = Net()
if FIXED:
    for param in model.parameters():
        param.requires_grad = False
    for param in model._fc.parameters():
        param.requires_grad = True
else:
    for name, param in model.named_parameters():
        if "bn" not in name:
            param.requires_grad = False
    for param in model._fc.parameters():
        param.requires_grad = False
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for _step in range(20):
    x = torch.randn(8, 3, 12, 12)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 5, (8,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
