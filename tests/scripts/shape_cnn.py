"""A small CNN whose flatten size was computed for 32x32 images (16 * 5 * 5 = 400 features
into fc1). Fed --size 64 images it crashes in fc1 with `mat1 and mat2 shapes cannot be
multiplied (8x2704 and 400x120)`; --size 32 is the fixed run."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=64)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 3, args.size, args.size)
y = torch.randint(0, 10, (8,))
for _step in range(args.steps):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
print("trained", args.steps, "steps")
