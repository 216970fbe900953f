"""Exact places: modules by their qualified names as the script reaches them (`net.4`, not
`4`; `transformer.h.3.attn` as it is), the line of the user's nearest the model call rather
than a launcher's, and a loss summed then divided (Hugging Face's causal-LM loss) not taken for
reduction='sum'."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from torchdoctor.frames import caller_frame
from torchdoctor.recipes.losses import LossWatch
from torchdoctor.telemetry.discovery import path_in_owner
from torchdoctor.telemetry.models import Models
from torchdoctor.telemetry.patches import Hooks


class Regressor(nn.Module):  # a LightningModule's shape: the model it calls is an attribute
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))

    def training_step(self, x: torch.Tensor) -> Any:
        return path_in_owner(self.net, sys._getframe())


def test_a_model_held_by_a_module_is_named_by_its_path() -> None:
    owner = Regressor()
    assert owner.training_step(torch.zeros(1, 2)) == "net"
    models = Models()
    assert models.add(owner.net, held_as="net")
    assert [models.name_of(m) for m in owner.net] == ["net.0", "net.1", "net.2"]
    assert models.name_of(owner.net) == "net"


def test_a_sequential_model_is_named_with_its_own_name() -> None:
    models = Models()
    seq = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    models.add(seq, label="model")
    assert models.name_of(seq[1]) == "model.1"  # "1" alone would not say where it is


def test_named_modules_keep_their_names() -> None:
    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = nn.ModuleDict({"h": nn.ModuleList([nn.Linear(2, 2)])})

    models = Models()
    gpt = GPT()
    models.add(gpt, label="model")
    assert models.name_of(gpt.transformer.h[0]) == "transformer.h.0"


def test_the_caller_of_torch_is_the_nearest_frame_outside_it() -> None:
    frame, mine = caller_frame(sys._getframe())
    assert frame.f_code.co_name == "test_the_caller_of_torch_is_the_nearest_frame_outside_it"
    assert mine  # the tests are the user's code here


class _Depth:
    level = 0


class _Replay:
    def loss_call(self, args: list[Any], inside_module: bool) -> None:
        return None


def _reductions(compute: Any) -> dict[str, int]:
    hooks = Hooks()
    watch = LossWatch(torch, hooks, _Depth(), _Replay())
    try:
        logits, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
        loss = compute(logits, target)
        watch.step_ended([float(loss)])
    finally:
        hooks.remove()
    return watch.reductions


def test_a_sum_divided_before_backward_is_not_reduction_sum() -> None:
    """transformers' ForCausalLMLoss: cross_entropy(reduction='sum') / num_items_in_batch."""
    divided = _reductions(lambda x, y: nn.functional.cross_entropy(x, y, reduction="sum") / 8)
    assert divided == {"sum, divided before backward()": 1}
    summed = _reductions(lambda x, y: nn.functional.cross_entropy(x, y, reduction="sum"))
    assert summed == {"sum": 1}
    mean = _reductions(lambda x, y: nn.functional.cross_entropy(x, y))
    assert mean == {"mean": 1}
