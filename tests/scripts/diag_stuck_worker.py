"""A data set that waits for a download a background thread was meant to finish; the
thread died, so the read waits forever (in a DataLoader worker process).
--fixed does not wait."""

import sys
import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
downloaded = threading.Event()


class Shards(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i >= 120 and not FIXED:
            downloaded.wait()  # shard 2 is "still downloading"
        return torch.randn(6), i % 3


model = nn.Linear(6, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Shards(), batch_size=20, num_workers=2)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
