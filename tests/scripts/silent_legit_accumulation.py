"""Gradient accumulation done right, in the ways real loops do it, which the silent-error
checks must leave alone: 4 micro-batches per update, each loss divided by 4 (or, with
--tokens, a sum over tokens divided by the update's token count, as HuggingFace's trainer
does), mixed precision with autocast, gradient clipping, a warm-up that starts at lr 0, and
the gradients cleared after each update."""

import sys

import torch
from torch import nn

TOKENS = "--tokens" in sys.argv
ACCUMULATE = 4
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(40, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 40))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / 10))
data = torch.utils.data.TensorDataset(torch.randint(0, 40, (2048, 9)))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
tokens_per_update = 0
for i, (seq,) in enumerate(loader):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logits = model(seq[:, :-1]).float()
    targets = seq[:, 1:]
    if TOKENS:
        mask = (targets % 7 != 0).float()  # padding, say
        if i % ACCUMULATE == 0:
            tokens_per_update = (
                sum(int((b[0][:, 1:] % 7 != 0).sum()) for b in [(seq,)]) * ACCUMULATE
            )  # an estimate of the update's tokens, as a count tensor below
        losses = nn.functional.cross_entropy(
            logits.reshape(-1, 40), targets.reshape(-1), reduction="none"
        )
        loss = (losses * mask.reshape(-1)).sum() / torch.tensor(float(tokens_per_update))
    else:
        loss = nn.functional.cross_entropy(logits.reshape(-1, 40), targets.reshape(-1))
        loss = loss / ACCUMULATE
    loss.backward()
    if (i + 1) % ACCUMULATE == 0:
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=False)
