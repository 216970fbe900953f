"""A real training loop with a planted out-of-memory: on step --fail-step, the module
`encoder.1` asks for 4 TiB in its forward (--where forward) or in the backward of its custom
autograd Function (--where backward). It prints the byte counts the tests compare with
torchdoctor's census."""

import argparse
import json

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--where", choices=("forward", "backward"), default="forward")
parser.add_argument("--fail-step", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()

IMPOSSIBLE = 2**42  # bytes: 4 TiB
current_step = 0


class BlowupFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        if current_step == args.fail_step:
            torch.empty(IMPOSSIBLE, dtype=torch.uint8)
        return grad


class Blowup(nn.Module):
    """Passes its input through; on the planted step it asks for an impossible allocation."""

    def forward(self, x):
        if args.where == "forward" and current_step == args.fail_step:
            wasted = torch.empty(IMPOSSIBLE, dtype=torch.uint8)
            return x + wasted.sum()
        return BlowupFn.apply(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), Blowup(), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.encoder(x))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch_size, 32)
y = torch.randint(0, 4, (args.batch_size,))


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


for current_step in range(args.fail_step + 1):
    # set_to_none=False: the gradients stay allocated through the next forward.
    optimizer.zero_grad(set_to_none=False)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    figures = {
        "step": current_step,
        "parameters": tensor_bytes(model.parameters()),
        "gradients": tensor_bytes(p.grad for p in model.parameters()),
        "optimizer_state": tensor_bytes(state),
    }
    print(json.dumps(figures), flush=True)
print("finished", flush=True)
