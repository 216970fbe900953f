"""Planted: a module appends each vector's length, sqrt(sum(x*x)), as a feature. Padding rows
are all zeros; sqrt(0) is 0 in the forward pass, but its gradient is infinite."""

import torch
from torch import nn

torch.manual_seed(0)


class WithLength(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = torch.sqrt((x * x).sum(-1, keepdim=True))
        return torch.cat([x, length], dim=-1)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32))
        self.features = WithLength()
        self.head = nn.Linear(33, 5)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) * (~pad).unsqueeze(-1)  # padding rows become zero vectors
        return self.head(self.features(h))


model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    x = torch.randn(64, 20)
    pad = torch.zeros(64, dtype=torch.bool)
    if step >= 12:
        pad[7] = True  # the first batch with padding
    y = torch.randint(0, 5, (64,))
    loss = nn.functional.cross_entropy(model(x, pad), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
print(f"final loss: {loss.item()}")
