"""The NaN localizer in this process: its replay draws the step's own random numbers
(dropout's masks) from the generator the step ran on and puts the process's random state back;
weights never initialised are named even when they hold no NaN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor

pytestmark = pytest.mark.usefixtures("uncompiled")  # the replay is off under torch.compile


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


def test_weights_never_initialised_are_named_though_finite(tmp_path: Path) -> None:
    # Memory that to_empty() or torch.empty() leaves need hold no NaN: values of 1e30 make the
    # first forward overflow all the same (found on the FSDP2 example: some runs had NaN in
    # the garbage, some only huge numbers, and then no module was named).
    from recording import saved_diagnoses

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[2].weight.fill_(1e30)  # finite, but never a trained weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        loss = model(torch.full((8, 4), 1e9)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    (nan,) = [d for d in saved_diagnoses(tmp_path / "run") if d["kind"] == "nan"]
    assert nan["step"] == 0 and nan["location"].endswith("2")  # the last Linear
    assert "as large as 1e+30 before the first update" in nan["summary"], nan["summary"]


def test_a_nan_seen_after_its_update_says_why_it_was_not_replayed() -> None:
    # On a GPU a step's values come back after its update; the localizer then waits for the
    # next step, checked in time. A run that ends first leaves no origin: say why.
    from helpers import series_inputs

    from torchdoctor.diagnose import nan

    inputs = series_inputs([1.0, 0.9, float("nan"), float("nan")])
    (plain,) = nan.diagnose(inputs)
    assert plain.step == 2 and "could not be replayed" in plain.summary
    inputs.events.append({"kind": "nan_armed", "data": {"step": 2}})
    (armed,) = nan.diagnose(inputs)
    assert "after its update" in armed.summary and "--guard" in armed.summary
