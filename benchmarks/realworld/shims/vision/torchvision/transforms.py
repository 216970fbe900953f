"""The transforms the programs use, on the uint8 tensors of the shim's datasets."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


class ToTensor:
    """uint8 H x W (x C) -> float C x H x W in [0, 1], as for a PIL image."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if img.dim() == 2:
            img = img.unsqueeze(-1)
        return img.permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std


class Lambda:
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, img: Any) -> Any:
        return self.fn(img)
