"""Polynomial regression updated by hand (param.data.add_), no torch.optim, stopping on a
loss threshold (the pattern of pytorch/examples regression)."""

import torch
import torch.nn.functional as F
from common import seed, show


def main() -> None:
    seed()
    w_target, b_target = torch.randn(4, 1) * 2, torch.randn(1) * 2
    fc = torch.nn.Linear(4, 1)
    for batch in range(1, 400):
        x = torch.randn(32)
        features = torch.stack([x**i for i in range(1, 5)], 1)
        y = features.mm(w_target) + b_target.item()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(features), y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.01 * param.grad)
        if batch % 20 == 0:
            show(f"batch {batch} loss", loss)
        if loss < 1e-3:
            break
    print("stopped after", batch)


if __name__ == "__main__":
    main()
