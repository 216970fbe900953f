"""EMA weights and a best-model snapshot made with copy.deepcopy (the timm ModelEmaV2 and
"keep the best checkpoint" patterns); the copies must behave like copies of an unprobed model."""

import copy

import torch
from common import params_digest, seed, show
from torch import nn


def main() -> None:
    seed()
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    best, best_loss = None, float("inf")
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(30):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)
        if loss.item() < best_loss:
            best_loss, best = loss.item(), copy.deepcopy(model)
        show(f"step {step} loss", loss.item())
    print("ema hooks", len(ema._forward_pre_hooks), "best hooks", len(best._forward_pre_hooks))
    print("forward hooks", len(ema._forward_hooks), len(best._forward_hooks))
    print("ema", params_digest(ema), "best", params_digest(best))
    show("ema output", ema(x).sum().item())
    clone = copy.copy(model)
    print("shallow copy hooks", len(clone._forward_pre_hooks), len(clone._forward_hooks))


if __name__ == "__main__":
    main()
