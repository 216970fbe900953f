"""A forward hook keeps every attention output "for visualisation" in a dict of lists,
tensors and graphs included. --fixed keeps only the last one, detached."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
captured: dict[str, list[torch.Tensor]] = {"attn": []}


def keep(module: nn.Module, args: tuple, output: tuple) -> None:
    if FIXED:
        captured["attn"] = [output[0].detach()]
    else:
        captured["attn"].append(output[0])


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(x)


model = nn.Sequential(nn.Embedding(100, 64), Block(), Block(), nn.Linear(64, 100))
model[1].attn.register_forward_hook(keep)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(200):
    start = torch.randint(0, 100, (16, 1))
    tokens = (start + torch.arange(65)) % 100  # a learnable sequence: count upwards
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 100), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
