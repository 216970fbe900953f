"""torch.compile(model) trained for a few steps (backend "eager": no compiler needed), then
Dynamo's own counters: graph breaks, frames compiled, graphs. A probe that broke graphs or
forced recompilation would change what this prints."""

import torch
from common import seed, show
from torch import nn
from torch._dynamo.utils import counters


def main() -> None:
    seed()
    model = nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(30):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        loss = nn.functional.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())
    print("graph breaks", sum(counters["graph_break"].values()))
    print("graphs", dict(counters["stats"]))  # graphs made and the calls captured in them
    print("recompiles", sum(counters["recompiles"].values()) if "recompiles" in counters else 0)


if __name__ == "__main__":
    main()
