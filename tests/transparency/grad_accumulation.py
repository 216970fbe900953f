"""Gradient accumulation over micro-batches with a scaled loss, with torch.optim and, in a
second loop, by hand (zeroing the gradients only every few micro-batches)."""

import torch
from common import seed, show
from torch import nn


def main() -> None:
    seed()
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    accumulate = 4
    for step in range(24):
        x, y = torch.randn(8, 10), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y) / accumulate
        loss.backward()
        if (step + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
        show(f"optim micro {step} loss", loss.item())
    manual = nn.Linear(10, 1)
    for step in range(12):
        x, y = torch.randn(8, 10), torch.randn(8, 1)
        loss = nn.functional.mse_loss(manual(x), y) / 3
        loss.backward()
        if (step + 1) % 3 == 0:
            with torch.no_grad():
                for p in manual.parameters():
                    p -= 0.05 * p.grad
                    p.grad = None
        show(f"manual micro {step} loss", loss.item())


if __name__ == "__main__":
    main()
