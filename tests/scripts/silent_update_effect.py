"""A hand-written optimizer whose step rebinds a local name instead of updating the weights in
place: step() runs, the weights never change (the category of TrainCheck's pytorch-115607,
where a compiled step stopped updating). --fixed updates in place."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class PlainSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.01) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if FIXED:
                    p.add_(p.grad, alpha=-group["lr"])
                else:
                    p = p - group["lr"] * p.grad  # the bug: rebinds the name, updates nothing


model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = PlainSGD(model.parameters(), lr=0.05)
for _step in range(20):
    x = torch.randn(16, 10)
    loss = nn.functional.mse_loss(model(x), x[:, :1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
