"""A dataset that draws its random crops from a numpy generator made in __init__: each of the
two DataLoader workers gets a copy of it, so both produce the same random crops, batch after
batch (TrainCheck's stackoverflow-67180955). --fixed seeds each worker's generator."""

import sys

import numpy as np
import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)


class RandomCrops(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.rng = np.random.RandomState(0)
        self.image = np.random.RandomState(1).rand(64).astype("float32")

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        start = self.rng.randint(0, 48)
        crop = torch.from_numpy(self.image[start : start + 16].copy())
        return crop, start % 2


def reseed(worker: int) -> None:
    dataset = torch.utils.data.get_worker_info().dataset
    dataset.rng = np.random.RandomState(torch.initial_seed() % 2**32)


if __name__ == "__main__":
    # wide enough that the workers keep up: the loop waits on its own work, not on them
    model = nn.Sequential(nn.Linear(16, 768), nn.ReLU(), nn.Linear(768, 768), nn.Linear(768, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(
        RandomCrops(), batch_size=16, num_workers=2, worker_init_fn=reseed if FIXED else None
    )
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
