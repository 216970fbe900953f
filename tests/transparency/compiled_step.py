"""A whole training step under torch.compile (backend "aot_eager"), the optimizer step inside
it, as recipes for compiled training loops write it; then Dynamo's own counters."""

import torch
from common import seed, show
from torch import nn
from torch._dynamo.utils import counters


def main() -> None:
    seed()
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    @torch.compile(backend="aot_eager")
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for step in range(25):
        loss = train_step(torch.randn(16, 8), torch.randn(16, 1))
        show(f"step {step} loss", loss.item())
    print("graph breaks", sum(counters["graph_break"].values()))
    print("graphs", dict(counters["stats"]))  # graphs made and the calls captured in them
    print("recompiles", sum(counters["recompiles"].values()) if "recompiles" in counters else 0)


if __name__ == "__main__":
    main()
