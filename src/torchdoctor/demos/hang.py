"""Planted: a data set whose worker blocks forever on a lock after a few batches."""

import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
stuck = threading.Event()


class Remote(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i >= 200:
            stuck.wait()  # a network read that never returns
        return torch.randn(8), i % 2


model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Remote(), batch_size=20)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
