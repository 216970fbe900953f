"""A custom autograd Function (forward/backward with ctx.save_for_backward) inside a model, and
torch.utils.checkpoint around a block."""

import torch
from common import seed, show
from torch import nn
from torch.utils.checkpoint import checkpoint


class Clamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 24)
        self.block = nn.Sequential(nn.Linear(24, 24), nn.SiLU(), nn.Linear(24, 24))
        self.b = nn.Linear(24, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = Clamp.apply(self.a(x))
        h = checkpoint(self.block, h, use_reentrant=False)
        return self.b(h)


def main() -> None:
    seed()
    model = Net()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    for step in range(10):
        x, y = torch.randn(16, 6) * 2, torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())


if __name__ == "__main__":
    main()
