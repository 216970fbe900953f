"""An MNIST-style classifier whose loop lost its optimizer.zero_grad() (TrainCheck's
stackoverflow-60335387): gradients add up across steps, and every update applies all the
earlier ones again. --fixed clears them before each backward(). --clip-huge: a loss a million
times larger, its gradients clipped to a norm of 1 (the old, clipped gradients then vanish in
the sum with the new ones, and only their being untouched tells the bug)."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
CLIP = "--clip-huge" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.utils.data.TensorDataset(torch.randn(640, 20), torch.randint(0, 4, (640,)))
loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
for _epoch in range(3):
    for x, y in loader:
        if FIXED:
            optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if CLIP:
            (loss * 1e6).backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        else:
            loss.backward()
        optimizer.step()
