"""A CUDA training loop that never synchronises with the host by itself; after a warm-up it
turns PyTorch's sync debug mode to "error", so any host-device sync (from torchdoctor's
hooks, say) raises."""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(256, 128, device="cuda")
y = torch.randint(0, 10, (256,), device="cuda")
for step in range(steps):
    if step == 5:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
torch.cuda.set_sync_debug_mode("default")
torch.cuda.synchronize()
print("no sync", flush=True)
