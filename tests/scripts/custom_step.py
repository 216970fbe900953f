"""Plain SGD by hand, without torch.optim: steps are marked with torchdoctor.step(loss)."""

import torch

import torchdoctor

torch.manual_seed(0)
w = torch.randn(5, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
true_w = torch.randn(5, 1)
for step in range(15):
    x = torch.randn(32, 5)
    loss = ((x @ w + b - x @ true_w) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for p in (w, b):
            p -= 0.1 * p.grad
            p.grad = None
    print(f"step {step} loss {loss.item():.8f}", flush=True)
    torchdoctor.step(loss)
