"""A self-attention block that passes its dropout to scaled_dot_product_attention whatever
the mode, as HuggingFace's FlashAttention2 modules did (TrainCheck's transformers-33844):
validation runs in eval mode, with dropout on. --fixed passes 0.0 in eval mode."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, dim: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        p = self.dropout if (self.training or not FIXED) else 0.0
        return self.out(nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p))


model = nn.Sequential(Attention(), nn.Flatten(), nn.Linear(16 * 6, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    model.train()
    x = torch.randn(8, 6, 16)
    loss = nn.functional.cross_entropy(model(x), (x[:, 0, 0] > 0).long())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 6, 16))
