"""Planted: an expensive transform in Dataset.__getitem__, loaded in the main process."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class SlowImages(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.0005)  # decoding and augmenting a JPEG, say
        return torch.randn(3, 16, 16), i % 10


model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(SlowImages(), batch_size=32, shuffle=True, num_workers=0)
for step, (x, y) in enumerate(loader):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 40:
        break
