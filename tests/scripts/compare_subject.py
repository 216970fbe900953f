"""A small, seeded training run for `torchdoctor compare`: the same script run twice with one
thing changed must be told apart by that thing.

  --steps N        optimizer steps (default 40)
  --slow-ms MS     the encoder's second block sleeps MS milliseconds in every forward (a planted
                   slowdown in one module)
  --workers N      DataLoader workers (default 0)
  --dtype NAME     float32 (default) or float64: the model's and the batches' dtype
  --batch N        batch size (default 16)
  --hold-mb MB     keep a tensor of MB megabytes alive while it trains (a planted memory rise)
  --barrier DIR    before the first step, write DIR/ready-<pid> and wait for DIR/go (two runs
                   started together then step at the same time, on the same machine's load)
"""

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--slow-ms", type=float, default=0.0)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--dtype", default="float32")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--hold-mb", type=int, default=0)
parser.add_argument("--barrier")
args = parser.parse_args()
held = torch.ones(args.hold_mb * (1 << 20) // 4) if args.hold_mb else None  # pages touched
dtype = getattr(torch, args.dtype)


class Block(nn.Module):
    def __init__(self, width: int, pause: float = 0.0) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)
        )
        self.pause = pause

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pause:
            time.sleep(self.pause)
        x = x + torch.tanh(self.attn(x))
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, width: int = 32, pause: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width, pause if i == 1 else 0.0) for i in range(3))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


torch.manual_seed(0)
model = Net(pause=args.slow_ms / 1000).to(dtype)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(1024, 8, dtype=dtype), torch.randint(0, 4, (1024,)))
generator = torch.Generator().manual_seed(0)
loader = DataLoader(
    data, batch_size=args.batch, shuffle=True, generator=generator, num_workers=args.workers
)
if args.barrier:
    barrier = Path(args.barrier)
    (barrier / f"ready-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.01)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.steps:
            break
print(f"loss {loss.item():.4f}")
