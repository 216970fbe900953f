"""Mixed precision in float16 without loss scaling or input normalisation: one batch of raw,
unnormalised features overflows float16's range (65504) in the first projection.
--fixed uses bfloat16 (float32's range). --device cuda runs it on a GPU; --steps N (20)."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
DEVICE = (
    "cuda"
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda"
    else "cpu"
)
STEPS = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
DTYPE = torch.bfloat16 if FIXED else torch.float16
torch.manual_seed(0)


class Tabular(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 256)
        self.body = nn.Sequential(nn.GELU(), nn.Linear(256, 256), nn.GELU())
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.proj(x)))


model = Tabular().to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(STEPS):
    x = torch.randn(32, 64, device=DEVICE)
    if step == 8:
        x = x * 20_000.0  # a batch of raw sensor values: normalisation skipped
    y = x[:, :4].sum(1, keepdim=True).clamp(-10, 10)
    with torch.autocast(DEVICE, dtype=DTYPE):
        loss = nn.functional.mse_loss(model(x).float(), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
