"""Regression in a loop that slices its own tensors (no DataLoader). --bug broadcast: the
model returns (N, 1) and the targets are (N,), so mse_loss broadcasts them to (N, N) and
compares every prediction with every target; without it, the fixed script."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none")
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(512, 8)
Y = X @ torch.randn(8) + 0.1 * torch.randn(512)  # (N,)
model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
batch = 32
for _epoch in range(20):
    for i in range(0, len(X), batch):
        xb, yb = X[i : i + batch], Y[i : i + batch]
        out = model(xb)
        if args.bug != "broadcast":
            out = out.squeeze(1)
        loss = nn.functional.mse_loss(out, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
