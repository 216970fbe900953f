"""A training script written the way public examples write them (pytorch/examples, timm,
nanoGPT): argparse, a model class, and a main() that owns the model, the optimizer, the
scheduler and the loaders, with train() and evaluate() functions and a table of results on
stdout. Nothing of it is a global of __main__ but the functions and the class: the README's
and docs' commands are run against it as written (tests/integration/test_docs_commands.py).

By default it trains 3 short epochs and saves `ckpt.pt`; `--epochs 0` trains until
`--stop-file` exists (a live process to question).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def stop_requested(args: argparse.Namespace) -> bool:
    return bool(args.stop_file) and os.path.exists(args.stop_file)


def train(model, loader, optimizer, args) -> float:
    model.train()
    total, batches = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total, batches = total + loss.item(), batches + 1
        if args.pause:
            time.sleep(args.pause)
        if stop_requested(args):
            break
    return total / max(batches, 1)


def evaluate(model, loader) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x), y, reduction="sum").item()
            count += len(y)
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=3, help="0: until --stop-file exists")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of extra work per step")
    parser.add_argument("--stop-file", default="stop")
    parser.add_argument("--save", default="ckpt.pt")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = torch.randn(320, 16)
    labels = (data[:, :4].argmax(dim=1) + (data[:, 4] > 1).long()) % 4
    train_loader = DataLoader(
        TensorDataset(data[:256], labels[:256]), batch_size=args.batch_size, shuffle=True
    )
    val_loader = DataLoader(TensorDataset(data[256:], labels[256:]), batch_size=64)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    print(f"{'epoch':>5} {'train loss':>10} {'val loss':>10} {'lr':>9}", flush=True)
    epoch = 0
    while args.epochs == 0 or epoch < args.epochs:
        train_loss = train(model, train_loader, optimizer, args)
        val_loss = evaluate(model, val_loader)
        lr = optimizer.param_groups[0]["lr"]
        print(f"{epoch:>5} {train_loss:>10.4f} {val_loss:>10.4f} {lr:>9.2e}", flush=True)
        scheduler.step()
        epoch += 1
        if stop_requested(args):
            break
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
