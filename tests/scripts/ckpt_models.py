"""Models for `torchdoctor ckpt --model tests/scripts/ckpt_models.py:FACTORY` in the tests."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Wrapper(nn.Module):
    """What a training framework saves: the network under a `model` attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Net()


def net() -> nn.Module:
    return Net(10)


def net1000() -> nn.Module:
    return Net(1000)


def wrapped() -> nn.Module:
    return Wrapper()


def mlp() -> nn.Module:
    """The network of tests/fixtures/ckpt/cuda_saved*.pt (tests/scripts/make_cuda_checkpoint.py)."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def other() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3))


def broken() -> nn.Module:
    raise RuntimeError("config/model.yaml not found")


def not_a_module() -> int:
    return 42
