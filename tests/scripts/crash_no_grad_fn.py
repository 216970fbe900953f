"""backward() on a loss with no grad_fn, for one of four reasons (argv[1]): `detached` (the
prediction cut from the graph with .detach()), `no_grad` (the forward run under
torch.no_grad(); `no_grad_loop`: the whole training called inside one), `frozen` (every
parameter frozen), `partly_frozen` (a GAN's loss on real images through a discriminator that
is frozen, as Lightning's toggle_optimizer() leaves it when the optimizers are unpacked in the
wrong order). The live crash names the right one first."""

import sys

import torch
from torch import nn


class Gan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Linear(4, 4)
        self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, real: bool) -> torch.Tensor:
        return self.discriminator(x if real else self.generator(x))


def main(how: str) -> None:
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    if how == "frozen":
        model.requires_grad_(False)
    if how == "partly_frozen":
        model = Gan()
        model.discriminator.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    if how == "no_grad_loop":
        with torch.no_grad():  # the whole training, as an evaluation is written
            train(model, optimizer, x, y, how)
    else:
        train(model, optimizer, x, y, how)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, x, y, how: str) -> None:  # type: ignore[no-untyped-def]
    for _step in range(3):
        if how == "no_grad":
            with torch.no_grad():
                out = model(x)
        elif how == "partly_frozen":
            out = model(x, real=True)
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
