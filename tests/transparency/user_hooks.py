"""The script's own hooks: forward pre-hooks and hooks on modules, a full backward hook, a
tensor hook and a global module hook; each counts its calls and may change values."""

import torch
from common import seed, show
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

calls = {"pre": 0, "fwd": 0, "bwd": 0, "tensor": 0, "global": 0}


def main() -> None:
    seed()
    model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 1))

    def pre(module: nn.Module, args: tuple) -> tuple:  # type: ignore[type-arg]
        calls["pre"] += 1
        return (args[0] * 0.5,)

    def fwd(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:  # type: ignore[type-arg]
        calls["fwd"] += 1
        return out + 0.1

    def bwd(module: nn.Module, grad_in: tuple, grad_out: tuple) -> None:  # type: ignore[type-arg]
        calls["bwd"] += 1

    def count_global(module: nn.Module, args: tuple, out: object) -> None:  # type: ignore[type-arg]
        calls["global"] += 1

    model.register_forward_pre_hook(pre)
    model[0].register_forward_hook(fwd)
    model[2].register_full_backward_hook(bwd)
    handle = register_module_forward_hook(count_global)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x, y = torch.randn(8, 5), torch.randn(8, 1)
        out = model(x)
        out.register_hook(lambda g: calls.__setitem__("tensor", calls["tensor"] + 1))
        loss = nn.functional.mse_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())
    handle.remove()
    print("calls", sorted(calls.items()))
    print("own pre-hooks", [type(h).__name__ for h in model._forward_pre_hooks.values()][:1])


if __name__ == "__main__":
    main()
