"""A GPU's device-side assert as a CPU-only machine can meet it: a small language model trains
two steps, then the loss's read raises the error text CUDA reports (the real one, on a GPU:
cuda_device_assert.py). What ranks the causes is the process's model, not the GPU.

    python crash_device_assert_text.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab = 100
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    ids = torch.randint(0, vocab, (8, 12))
    loss = F.cross_entropy(model(ids).view(-1, vocab), ids.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 2:
        raise RuntimeError(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call, so the stacktrace below might "
            "be incorrect."
        )
    print(f"step {step} loss {loss.item():.4f}")
