"""DataLoader with worker processes started by fork and by spawn, with a worker_init_fn and a
seeded generator (the reproducibility recipe), training on what they load."""

import sys

import torch
from common import seed, show
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((4,), float(i) / 64) + torch.rand(4) * 0.01
        return x, x.pow(2).sum(dim=0, keepdim=True)


def init_worker(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def train(context: str) -> None:
    seed()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        Squares(),
        batch_size=16,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=init_worker,
        generator=torch.Generator().manual_seed(0),
        shuffle=True,
        persistent_workers=True,
    )
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            show(f"{context} epoch {epoch} loss", loss.item())


if __name__ == "__main__":
    for context in sys.argv[1:] or ["fork", "spawn"]:
        train(context)
