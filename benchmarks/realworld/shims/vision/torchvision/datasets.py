"""Synthetic datasets with torchvision's signatures.

MNIST is learnable: each class is a fixed random 28x28 template, a sample is its template
plus noise, so a healthy run's loss falls (a run on pure noise would rightly be diagnosed as
not learning). Sizes are small so that an epoch is a few dozen steps; the harness may set
REALWORLD_MNIST_TRAIN / REALWORLD_MNIST_TEST to change them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch


class _Images(torch.utils.data.Dataset):
    """Images held as uint8 tensors (H x W or H x W x C, as PIL would give them), targets as
    ints; `transform` receives the uint8 tensor where torchvision passes a PIL image."""

    def __init__(
        self,
        data: torch.Tensor,
        targets: torch.Tensor,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None,
    ) -> None:
        self.data = data
        self.targets = targets
        self.transform = transform
        self.target_transform = target_transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img: Any = self.data[index]
        target: Any = int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


def _templates(classes: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand((classes, *shape), generator=g)


class MNIST(_Images):
    classes = [
        f"{i} - {n}"
        for i, n in enumerate(
            ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
        )
    ]

    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        self.root = root
        self.train = train
        n = int(
            os.environ.get(
                "REALWORLD_MNIST_TRAIN" if train else "REALWORLD_MNIST_TEST",
                "1920" if train else "500",
            )
        )
        g = torch.Generator().manual_seed(1 if train else 2)
        templates = _templates(10, (28, 28), seed=0)
        targets = torch.randint(0, 10, (n,), generator=g)
        noise = torch.rand((n, 28, 28), generator=g)
        images = (0.7 * templates[targets] + 0.3 * noise) * 255
        super().__init__(images.to(torch.uint8), targets, transform, target_transform)


class FakeData(_Images):
    """torchvision.datasets.FakeData: random images, random labels (as the real one)."""

    def __init__(
        self,
        size: int = 1000,
        image_size: tuple[int, int, int] = (3, 224, 224),
        num_classes: int = 10,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        random_offset: int = 0,
    ) -> None:
        g = torch.Generator().manual_seed(random_offset)
        c, h, w = image_size
        data = (torch.rand((size, h, w, c), generator=g) * 255).to(torch.uint8)
        targets = torch.randint(0, num_classes, (size,), generator=g)
        super().__init__(data, targets, transform, target_transform)
