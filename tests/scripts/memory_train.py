"""A real training loop whose memory grows with the batch: tokens of a sequence go through
residual MLP blocks that widen 16 -> 4096 -> 16, so activations take about 6 MiB per sample
and the arithmetic stays cheap.

--batch-size N     samples per step
--steps N          stop after N steps (default: run until the stop file exists)
--cap MIB          cap this process's address space at MIB above what it uses after set-up
                   (a real CPU out-of-memory error instead of the kernel's OOM killer)
--leak             each step, also compute a validation loss without torch.no_grad() and keep
                   it in the global list `losses`: every one keeps its autograd graph alive
--hold             after --steps, keep the process (and its tensors) until the stop file exists
--device cuda      train on the GPU; --memory-fraction F caps this process at F of its memory
--big-batch N      on step --big-at (default 2), use a batch of N: a real OOM under a cap
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps", type=int, default=0)
parser.add_argument("--cap", type=float, default=0.0)
parser.add_argument("--leak", action="store_true")
parser.add_argument("--hold", action="store_true")
parser.add_argument("--device", default="cpu")
parser.add_argument("--memory-fraction", type=float, default=0.0)
parser.add_argument("--big-batch", type=int, default=0)
parser.add_argument("--big-at", type=int, default=2)
parser.add_argument(
    "--optimizer",
    choices=("adam", "manual"),
    default="adam",
    help="manual: plain SGD by hand (starts faster: torch.optim imports torch._dynamo)",
)
parser.add_argument("--stop-file", default="stop")
parser.add_argument("--pause", type=float, default=0.0)
args = parser.parse_args()

TOKENS, WIDTH, HIDDEN = 64, 16, 4096


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.act = nn.GELU()
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


torch.manual_seed(0)
device = torch.device(args.device)
if device.type == "cuda" and args.memory_fraction:
    # an index: torch before 2.12 refuses a bare "cuda" device here
    torch.cuda.set_per_process_memory_fraction(args.memory_fraction, device.index or 0)
model = Net().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if args.optimizer == "adam" else None
losses = []
print(json.dumps({"parameters": sum(p.numel() * p.element_size() for p in model.parameters())}))


def vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


if args.cap:
    limit = vm_size() + int(args.cap * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

step = 0
while True:
    batch = args.big_batch if args.big_batch and step == args.big_at else args.batch_size
    x = torch.randn(batch, TOKENS, WIDTH, device=device)
    y = torch.randint(0, 4, (batch,), device=device)
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    else:
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
    if args.leak:
        x_val = torch.randn(batch, TOKENS, WIDTH, device=device)
        losses.append(nn.functional.cross_entropy(model(x_val), y))
    step += 1
    print(json.dumps({"step": step, "loss": float(loss)}), flush=True)
    if args.pause:
        time.sleep(args.pause)
    if args.stop_file and os.path.exists(args.stop_file):
        break
    if args.steps and step >= args.steps:
        print("held" if args.hold else "done", flush=True)
        while args.hold and not os.path.exists(args.stop_file):
            time.sleep(0.02)
        break
print("finished", flush=True)
sys.exit(0)
