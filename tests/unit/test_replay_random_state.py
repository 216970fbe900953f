"""A NaN replay draws the step's own random numbers (dropout's masks), from the generator the
step ran on, and leaves the process's random state as the step left it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torchdoctor


class Noisy(nn.Module):
    """Records every draw of its forward; its fourth call (step 3) makes a NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.drop = nn.Dropout(0.5)
        self.draws: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.draws.append(torch.rand(3))
        out = self.lin(self.drop(x))
        return out * float("nan") if len(self.draws) == 4 else out


def _train(model: Noisy, steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(8, 4)
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.rand(2)  # what the script draws next


def test_the_replay_draws_the_steps_numbers_and_puts_the_state_back(tmp_path: Path) -> None:
    plain = Noisy()
    after_plain = _train(plain, 5)
    model = Noisy()
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        after = _train(model, 5)
    assert len(model.draws) == len(plain.draws) + 1  # one replayed forward
    assert torch.equal(model.draws[4], model.draws[3])  # the step's own numbers
    assert torch.equal(after, after_plain)  # and the script's next ones unchanged
