"""A classifier trained from a DataLoader, with one planted bug at a time (--bug):
  head_after_optimizer  fine-tuning: the backbone is frozen and a new head replaces the old
                        one after the optimizer was built, so nothing the optimizer holds trains
  softmax               the model ends in a softmax and the loss is CrossEntropyLoss
  tiny_lr               SGD with lr=1e-7
  none                  the fixed script
It logs every 50 steps and saves a checkpoint at the end (side effects torchdoctor keeps)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 32), torch.randint(0, 10, (256,)))
loader = DataLoader(data, batch_size=16, shuffle=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)
        self.out = nn.Softmax(dim=1) if args.bug == "softmax" else nn.Identity()

    def forward(self, x):
        return self.out(self.head(self.body(x)))


model = Net()
criterion = nn.CrossEntropyLoss()
if args.bug == "tiny_lr":
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-7)
else:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
if args.bug == "head_after_optimizer":
    model.requires_grad_(False)
    model.head = nn.Linear(64, 10)  # trainable, but not in the optimizer

step = 0
for _epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        step += 1
torch.save(model.state_dict(), "classifier.pt")
print("saved")
