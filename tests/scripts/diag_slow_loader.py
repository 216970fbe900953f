"""Images read from slow storage (4 ms per sample) in the main process.
--fixed loads with four workers, which overlap the reads."""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class Remote(Dataset):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.004)  # a read from network storage
        g = torch.Generator().manual_seed(i)
        image = torch.randn(3, 8, 8, generator=g)
        return image, int(image[0].sum() > 0)


model = nn.Sequential(nn.Flatten(), nn.Linear(192, 256), nn.ReLU(), nn.Linear(256, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(
    Remote(),
    batch_size=8,
    num_workers=4 if FIXED else 0,
    prefetch_factor=8 if FIXED else None,
    persistent_workers=FIXED,
)
for step, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.01)  # the rest of a real model's step on the device
    if step == 40:
        break
