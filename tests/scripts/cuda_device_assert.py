"""A token id past the embedding's end on the GPU, at step 3: a device-side assert, reported at
the next call that waits for the device (the loss's .item()), as users meet it.

    python cuda_device_assert.py [--steps N]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
vocab = 100
emb = torch.nn.Embedding(vocab, 16).cuda()
head = torch.nn.Linear(16, vocab).cuda()
optimizer = torch.optim.AdamW([*emb.parameters(), *head.parameters()], lr=1e-3)
for step in range(args.steps):
    ids = torch.randint(0, vocab, (8, 12), device="cuda")
    if step == 3:
        ids[0, 0] = vocab  # the bug: a vocabulary one too small
    logits = head(emb(ids))
    loss = F.cross_entropy(logits.view(-1, vocab), ids.view(-1).clamp(max=vocab - 1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
