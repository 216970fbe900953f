"""Mixed precision on the CPU: autocast to bfloat16 and a GradScaler (the AMP recipe), with
unscale_ and gradient clipping before the step."""

import torch
from common import seed, show
from torch import nn


def main() -> None:
    seed()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(12):
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        show(f"step {step} loss", loss.item())
        show(f"step {step} norm", norm.item())
    print("scale", scaler.get_scale())


if __name__ == "__main__":
    main()
