"""Gradient accumulation over 4 micro-batches, done wrong three ways:
  (default)        the micro-batch losses are not divided by 4: updates 4x too large
  --wrong-divisor  they are divided by 8 (a stale constant): updates half as large
  --clear-each     zero_grad() inside the micro-batch loop: only the last micro-batch counts
--own-batches: no DataLoader; each micro-batch sliced at random from tensors in memory, as
nanoGPT's get_batch does.
--fixed divides by 4 and clears the gradients after each update (with gradient clipping and
a learning-rate warm-up, as real loops have)."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
ACCUMULATE = 4
CLEAR_EACH = "--clear-each" in sys.argv and not FIXED
WRONG = 8 if "--wrong-divisor" in sys.argv else 1  # 1: not divided
DIVISOR = ACCUMULATE if FIXED or CLEAR_EACH else WRONG
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
data = torch.utils.data.TensorDataset(torch.randn(1024, 16), torch.randn(1024, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
if "--own-batches" in sys.argv:
    rows = torch.randint(0, len(data), (128, 8))
    loader = [data[r] for r in rows]  # type: ignore[assignment]
for _epoch in range(2):
    for i, (x, y) in enumerate(loader):
        if CLEAR_EACH:
            optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        (loss / DIVISOR if DIVISOR != 1 else loss).backward()
        if (i + 1) % ACCUMULATE == 0:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
