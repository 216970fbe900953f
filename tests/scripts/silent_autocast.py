"""Mixed precision that never happens (TrainCheck's lightning-thunder-725: a backend whose
linear layers autocast no longer reached): the training step runs under autocast(bfloat16),
but the model's linear layers compute through a path that turns autocast off, so every
matmul runs in float32. --fixed uses nn.Linear, which autocast covers."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class BackendLinear(nn.Linear):
    """A linear layer run by a backend of its own (here: with autocast switched off)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return nn.functional.linear(x.float(), self.weight, self.bias)


Linear = nn.Linear if FIXED else BackendLinear
model = nn.Sequential(Linear(16, 32), nn.ReLU(), Linear(32, 32), nn.ReLU(), Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(20):
    x = torch.randn(16, 16)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), x[:, :1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
