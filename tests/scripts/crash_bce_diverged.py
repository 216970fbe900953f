"""A sigmoid model trained with BCELoss and a learning rate far too high (argv[1] "high"; "fine"
for a sane one, then argv[2] "logits" feeds BCELoss the raw outputs): the loss runs away, the
predictions turn NaN and binary_cross_entropy raises that its input is outside [0, 1]. The
live crash names the learning rate first when the run diverged, logits when it did not."""

import sys

import torch
from torch import nn


def main(lr_kind: str, output: str) -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)]
    model = nn.Sequential(*layers, *([nn.Sigmoid()] if output == "probs" else []))
    lr = 1e37 if lr_kind == "high" else 1e-3
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(64, 8) * 3, torch.randint(0, 2, (64, 1)).float()
    for step in range(200):
        loss = nn.functional.binary_cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "probs")
