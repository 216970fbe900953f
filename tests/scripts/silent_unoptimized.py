"""Fine-tuning that replaces the classifier head after building the optimizer: the new head
gets gradients every step and no optimizer applies them.
--fixed builds the optimizer after the head is replaced."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


model = Net()
if not FIXED:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model.fc = nn.Linear(32, 4)  # the new task has 4 classes
if FIXED:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for _step in range(30):
    x = torch.randn(16, 20)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 4, (16,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
