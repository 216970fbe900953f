"""Models and training steps the benchmarks share."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class TinyTransformer(nn.Module):
    """The bundled demo's kind of model: a small pre-norm transformer language model."""

    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        block = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(tokens))))


def transformer_step(batch: int = 16, seq: int = 64, device: str = "cpu") -> Callable[[], float]:
    torch.manual_seed(0)
    model = TinyTransformer().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 512, (batch, seq + 1), device=device)

    def step() -> float:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device != "cpu":
            torch.cuda.synchronize()  # time the device's work, not just the launches
        return 0.0

    return step


def tiny_step() -> Callable[[], float]:
    """A step of about half a millisecond: the fixed cost per step shows up here."""
    return tiny_parts()[0]


def tiny_parts() -> tuple[Callable[[], float], nn.Module]:
    """tiny_step's step, and its model (for a benchmark that hooks it itself)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))

    def step() -> float:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step, model
