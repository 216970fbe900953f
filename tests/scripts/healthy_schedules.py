"""Healthy training runs whose loss does things a naive divergence check mistakes for trouble.

--schedule warmup-cosine  an MLP classifier, AdamW, linear warm-up then cosine decay
--schedule sgdr           a regression memorised to a tiny loss by Adam with warm restarts:
                          the loss jumps by orders of magnitude after a restart (Adam's
                          second moments have shrunk with the gradients), briefly, then falls
--schedule noisy          batch size 1: the loss of one sample, step to step
"""

import argparse
import math

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--schedule", required=True, choices=["warmup-cosine", "sgdr", "noisy"])
parser.add_argument("--steps", type=int, default=400)
args = parser.parse_args()
torch.manual_seed(0)

if args.schedule == "warmup-cosine":
    centers = torch.randn(4, 16) * 2
    labels = torch.randint(0, 4, (4096,))
    data = centers[labels] + torch.randn(4096, 16)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = max(1, args.steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    for step in range(args.steps):
        batch = torch.randint(0, 4096, (32,))
        loss = nn.functional.cross_entropy(model(data[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.6g} lr {scheduler.get_last_lr()[0]:.3g}")

elif args.schedule == "sgdr":
    x = torch.randn(64, 8)
    y = torch.sin(x @ torch.randn(8, 1))
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    period = max(20, args.steps // 4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=period)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.6g} lr {scheduler.get_last_lr()[0]:.3g}")

else:
    x = torch.randn(2048, 8)
    y = x @ torch.randn(8, 1) + 0.3 * torch.randn(2048, 1)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        i = torch.randint(0, 2048, (1,))
        loss = nn.functional.mse_loss(model(x[i]), y[i])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6g}")
