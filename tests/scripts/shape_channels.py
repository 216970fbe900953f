"""An RGB model (nn.Sequential blocks) that trains fine until step 3, where the data source
hands it grayscale images: `features.0` (a Conv2d for 3 channels) gets 1 channel. Step 3 is not
a traced step, so the shapes that flowed come from the last traced one. --fixed converts the
grayscale batch to RGB (the fixed version)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true")
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(6 * 14 * 14, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def batch(step):
    if step == 3:  # another source: grayscale
        x = torch.randn(8, 1, 32, 32)
        return (x.expand(-1, 3, -1, -1) if args.fixed else x), torch.randint(0, 10, (8,))
    return torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(5):
    x, y = batch(step)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
print("done")
