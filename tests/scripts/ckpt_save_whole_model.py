"""Saves a whole model with torch.save(model), its class defined here in __main__ (the classic
checkpoint that needs code to load), and its state dict alongside for comparison.

    python ckpt_save_whole_model.py OUT.pt STATE.pt
"""

from __future__ import annotations

import sys

import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 10)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


torch.manual_seed(0)
model = TinyNet()
model.features[1].running_mean.add_(1.5)
torch.save(model, sys.argv[1])
torch.save(model.state_dict(), sys.argv[2])
