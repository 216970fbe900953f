"""A CUDA training loop that never synchronises with the host by itself; after a warm-up it
turns PyTorch's sync debug mode to "error", so any host-device sync (from torchdoctor's
hooks, say) raises.

    python cuda_no_sync.py [STEPS] [--no-zero-grad]

--no-zero-grad drops the loop's zero_grad(): a silent bug, found by checks that must not
sync either (they run on steps 1-3 and again at 50 and 51)."""

import sys

import torch
from torch import nn

args = [a for a in sys.argv[1:] if not a.startswith("--")]
steps = int(args[0]) if args else 40
zero_grad = "--no-zero-grad" not in sys.argv
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
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
torch.cuda.set_sync_debug_mode("default")
torch.cuda.synchronize()
print("no sync", flush=True)
