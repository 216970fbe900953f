"""A GAN-style discriminator with dropout, batch norm and spectral norm (TrainCheck's
pytorch-51800 uses spectral norm): the script evaluates the untrained model first with
model.eval() and never calls model.train() again, so it trains in eval mode: dropout off,
batch norm on running statistics, spectral norm's power iteration never run.
--functional: the model's only dropout is a functional call, F.dropout(x, p,
training=self.training), as graph attention networks write it (no Dropout module to see).
--fixed calls model.train() after the evaluation."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class FunctionalDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(12, 32)
        self.out = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(self.hidden(x).relu(), 0.3, training=self.training)
        return self.out(h)


model: nn.Module = nn.Sequential(
    nn.utils.parametrizations.spectral_norm(nn.Linear(12, 32, bias=False)),
    nn.BatchNorm1d(32),
    nn.ReLU(),
    nn.Dropout(0.3),
    nn.Linear(32, 2),
)
if "--functional" in sys.argv:
    model = FunctionalDropout()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def evaluate() -> float:
    model.eval()
    with torch.no_grad():
        x = torch.randn(64, 12)
        return nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).item()


evaluate()  # how good is the initialisation?
if FIXED:
    model.train()
for step in range(60):
    x = torch.randn(32, 12)
    loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 19:
        evaluate()
        if FIXED:
            model.train()
