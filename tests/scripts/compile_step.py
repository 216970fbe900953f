"""A small training loop under torch.compile with backend="eager" (no compiler needed: CPU),
for the torch.compile report (tests/integration/test_compile_report.py).

    python compile_step.py MODE [--fixed] [--plain]

MODE graph_break: the compiled step prints the loss with .item() (graph breaks at that line);
     --fixed prints it after the call instead.
MODE recompiles: batches of changing size (token-budget batching) into a function compiled
     with dynamic=False: a recompilation for every new size, up to the recompile limit;
     --fixed keeps the default dynamic=None and marks dimension 0 of the batch dynamic.
MODE clean: a compiled step with nothing to report.
MODE module: a compiled nn.Module (the other modes compile functions of tensors).
MODE eager: the same loop, never compiled (says whether torch._dynamo was imported).
--plain runs it without torchdoctor, to compare what the script prints.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

mode = sys.argv[1]
fixed = "--fixed" in sys.argv
if "--plain" not in sys.argv:
    import torchdoctor

    torchdoctor.start()  # the compile report comes with the telemetry: nothing else to call

torch.manual_seed(0)
params = [
    (torch.randn(16, 32) * 0.25).requires_grad_(),
    torch.zeros(32, requires_grad=True),
    (torch.randn(32, 4) * 0.2).requires_grad_(),
    torch.zeros(4, requires_grad=True),
]
optimizer = torch.optim.SGD(params, lr=0.05)


def mlp(x: torch.Tensor) -> torch.Tensor:
    w1, b1, w2, b2 = params
    return (x @ w1 + b1).relu() @ w2 + b2


def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(mlp(x), y)
    if mode == "graph_break" and not fixed:
        print(f"loss {loss.item():.4f}")  # the bug: a print and .item() in the compiled step
    return loss


if mode != "eager":
    train_step = torch.compile(train_step, backend="eager")


if mode == "recompiles":
    forward = torch.compile(mlp, backend="eager", dynamic=None if fixed else False)
    for size in (32, 29, 24, 32, 21, 18, 27, 16, 25, 30, 14, 22):
        x, y = torch.randn(size, 16), torch.randn(size, 4)
        if fixed:
            torch._dynamo.mark_dynamic(x, 0)
        optimizer.zero_grad()
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        optimizer.step()
        print(f"batch {size} loss {loss.item():.4f}")
elif mode == "module":
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 4)), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for _step in range(5):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}")
elif mode == "eager":
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for _step in range(5):
        optimizer.zero_grad()
        loss = F.mse_loss(mlp(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.4f}")
    print("dynamo imported", "torch._dynamo" in sys.modules)
    sys.exit(0)
else:
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for _step in range(5):
        optimizer.zero_grad()
        loss = train_step(x, y)
        loss.backward()
        optimizer.step()
        if mode != "graph_break" or fixed:
            print(f"loss {loss.item():.4f}")

counters = torch._dynamo.utils.counters
print("graph breaks", sum(counters["graph_break"].values()))
print("graphs", counters["stats"]["unique_graphs"])
