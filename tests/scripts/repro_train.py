"""A small training run for `torchdoctor repro`. By default nothing is seeded: the model's
initialisation, the DataLoader's shuffle and the dropout masks come from torch's unseeded CPU
generator, and an augmentation draws a noise level from Python's `random` and a scale from
NumPy. --seeded adds the ritual's lines this script needs (random, NumPy, torch; it has no CUDA
and no workers), and its runs are bit-identical.
--init FILE loads the initial weights from FILE and turns shuffle and the augmentation off: only
the dropout masks differ between runs."""

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seeded", action="store_true")
parser.add_argument("--init")
args = parser.parse_args()

if args.seeded:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)

data = TensorDataset(torch.linspace(-1, 1, 64).reshape(32, 2), torch.arange(32) % 2)
loader = DataLoader(data, batch_size=8, shuffle=args.init is None)
model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
if args.init:
    model.load_state_dict(torch.load(args.init))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _epoch in range(3):
    for x, y in loader:
        noise = 0.0 if args.init else random.uniform(0.0, 0.01) * float(np.random.rand())
        loss = nn.functional.cross_entropy(model(x + noise), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print("done")
