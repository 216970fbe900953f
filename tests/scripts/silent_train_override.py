"""A backbone that freezes its first stages in train(), as mmpretrain's do (TrainCheck's
mmpretrain-702): the loop never calls model.train(), so the stages it should freeze train.
--fixed calls model.train() first."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Backbone(nn.Module):
    def __init__(self, frozen_stages: int = 1) -> None:
        super().__init__()
        self.frozen_stages = frozen_stages
        self.stages = nn.ModuleList(
            [nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()) for _ in range(3)]
        )

    def train(self, mode: bool = True) -> "Backbone":
        super().train(mode)
        for stage in self.stages[: self.frozen_stages]:  # frozen: no updates, fixed statistics
            stage.eval()
            for p in stage.parameters():
                p.requires_grad = False
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


model = Classifier()
if FIXED:
    model.train()
optimizer = torch.optim.SGD([p for p in model.parameters()], lr=0.05, momentum=0.9)
for _step in range(30):
    x = torch.randn(16, 16)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 3, (16,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
