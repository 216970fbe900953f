"""Models: an untrained ResNet-18 only (pytorch/examples' siamese_network builds one with
`weights=None`, swaps its first convolution and drops its last layer). Written here with the
usual layout: the same child names and order (conv1, bn1, relu, maxpool, layer1-4, avgpool,
fc), two basic blocks a stage, 64 to 512 channels."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, added to the input (projected by a strided 1x1
    convolution where the shape changes)."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or channels_in != channels_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                nn.BatchNorm2d(channels_out),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + skip)


class ResNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = (64, 128, 256, 512)
        stages = []
        for i, width in enumerate(widths):
            before = widths[i - 1] if i else 64
            stride = 1 if i == 0 else 2
            stages.append(
                nn.Sequential(BasicBlock(before, width, stride), BasicBlock(width, width, 1))
            )
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(weights: Any = None, num_classes: int = 1000) -> ResNet:
    if weights is not None:
        raise ValueError("the realworld stand-in for torchvision has no pretrained weights")
    return ResNet(num_classes)


# Names other libraries import from torchvision at their own import (torchmetrics' image and
# detection metrics): there, so that the import works; no program here calls them.
def _absent(name: str) -> Any:
    def absent(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the realworld stand-in for torchvision has no {name}")

    absent.__name__ = name
    return absent


resnet50 = _absent("resnet50")
vgg16 = _absent("vgg16")
alexnet = _absent("alexnet")
squeezenet1_1 = _absent("squeezenet1_1")


class VGG16_Weights:
    DEFAULT = None
