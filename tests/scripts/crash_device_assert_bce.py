"""A GPU's device-side assert as a CPU-only machine can meet it, in a model trained with BCE:
three steps, then the loss's read raises the error text CUDA reports (on a GPU, BCE's kernel
asserts on a value outside [0, 1]; pytorch/examples' VAE under a learning rate 500 times its
own met it so). The text cannot tell NaN from logits; the loss's graph can.

    python crash_device_assert_bce.py probs|logits
"""

from __future__ import annotations

import sys

import torch
from torch import nn

torch.manual_seed(0)
layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)]
model = nn.Sequential(*layers, *([nn.Sigmoid()] if sys.argv[1] == "probs" else []))
if sys.argv[1] == "logits":  # raw outputs, near 0.5 for a few steps: CPU's BCE accepts them
    nn.init.zeros_(layers[-1].weight)
    nn.init.constant_(layers[-1].bias, 0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(4):
    x = torch.rand(32, 8)
    loss = nn.functional.binary_cross_entropy(model(x), x)
    optimizer.zero_grad()
    loss.backward()
    if step == 3:
        raise RuntimeError(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might "
            "be incorrect."
        )
    optimizer.step()
