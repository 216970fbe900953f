"""backward() on a loss with no grad_fn, for one of three reasons (argv[1]): `detached` (the
prediction cut from the graph with .detach()), `no_grad` (the forward run under
torch.no_grad()), `frozen` (every parameter frozen). The live crash names the right one first."""

import sys

import torch
from torch import nn


def main(how: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    if how == "frozen":
        model.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _step in range(3):
        if how == "no_grad":
            with torch.no_grad():
                out = model(x)
        else:
            out = model(x)
        if how == "detached":
            out = out.detach()
        loss = nn.functional.mse_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main(sys.argv[1])
