"""A trained model handed to TorchScript (script and trace, saved and loaded) and to
torch.export, as deployment code does after training."""

import torch
from common import seed, show
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def main() -> None:
    seed()
    model = Block()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    for step in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())
    model.eval()
    scripted = torch.jit.script(model)
    scripted.save("scripted.pt")
    traced = torch.jit.trace(model, torch.randn(2, 4))
    traced.save("traced.pt")
    show("scripted", torch.jit.load("scripted.pt")(x).sum().item())
    show("traced", torch.jit.load("traced.pt")(x).sum().item())
    example = torch.randn(2, 4)
    exported = torch.export.export(model, (example,))
    show("exported", exported.module()(example).sum().item())
    print(
        "export graph ops",
        sorted({str(n.target) for n in exported.graph.nodes if n.op == "call_function"}),
    )
    print("hooks after export", len(model._forward_pre_hooks) >= 0)


if __name__ == "__main__":
    main()
