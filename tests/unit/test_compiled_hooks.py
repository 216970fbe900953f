"""The compiled hooks (native/steady.cpp) stand in for the Python ones while no torch.compile is
in use, and leave nothing behind that a copy, a file, TorchScript or Dynamo would see: the
copies and files leave them out like the Python ones, and the first torch.compile swaps each
for its Python twin in place (Dynamo cannot trace a builtin: with fullgraph=True it would
fail on one)."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from types import FunctionType

import pytest
import torch
from torch import nn
from torch.optim import optimizer as optimizer_hooks

import torchdoctor

pytestmark = pytest.mark.usefixtures("uncompiled")


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _ours(model: nn.Module) -> list[object]:
    return [*model._forward_pre_hooks.values(), *model._forward_hooks.values()]


def test_the_first_torch_compile_swaps_in_the_python_hooks(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer()
    with torchdoctor.Session(tmp_path, quiet=True) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None and recorder.steady_handlers is not None
        _train(model, opt, 4)
        hooks = _ours(model)
        assert len(hooks) == 2 and all(type(h) is not FunctionType for h in hooks)
        assert type(torch.autograd.backward) is not FunctionType
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        # every hook of ours is Python now, in the same places
        assert [type(h) for h in _ours(model)] == [FunctionType, FunctionType]
        assert all(
            type(h) is FunctionType
            for h in (
                *optimizer_hooks._global_optimizer_pre_hooks.values(),
                *optimizer_hooks._global_optimizer_post_hooks.values(),
            )
        )
        assert type(torch.autograd.backward) is FunctionType
        losses = _train(compiled, opt, 4)  # fullgraph: a builtin hook would fail here
        assert all(loss == loss for loss in losses)
        assert recorder.switch.on
        rows = recorder.tables["steps"].snapshot().rows
    assert rows == 8


def test_copies_files_and_torchscript_leave_the_compiled_hooks_out(tmp_path: Path) -> None:
    model, opt = _model_and_optimizer()
    with torchdoctor.Session(tmp_path, quiet=True) as session:
        _train(model, opt, 3)
        hooks = _ours(model)  # hooked, with the compiled hooks
        assert len(hooks) == 2 and all(type(h) is not FunctionType for h in hooks)
        twin = copy.deepcopy(model)
        assert _ours(twin) == []
        buffer = io.BytesIO()
        torch.save(model, buffer)
        assert b"SteadyStep" not in buffer.getvalue()
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert _ours(loaded) == []
        scripted = torch.jit.script(model)
        assert scripted(torch.ones(1, 4)).shape == (1, 2)
        assert len(_ours(model)) == 2  # put back after scripting
        traced = torch.jit.trace(model, torch.ones(1, 4))  # runs the hooks, which stand aside
        assert traced(torch.ones(1, 4)).shape == (1, 2)
        _train(model, opt, 2)
        recorder = session.ensure_telemetry()
        assert recorder is not None and recorder.switch.on
        assert recorder.tables["steps"].snapshot().rows == 5


def test_a_strict_export_traces_the_python_hooks(tmp_path: Path) -> None:
    # torch.export with strict=True traces the model's hooks with Dynamo, without torch.compile
    model, opt = _model_and_optimizer()
    with torchdoctor.Session(tmp_path, quiet=True) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None
        _train(model, opt, 3)
        assert all(type(h) is not FunctionType for h in _ours(model))  # compiled until now
        program = torch.export.export(model, (torch.randn(2, 4),), strict=True)
        assert [type(h) for h in _ours(model)] == [FunctionType, FunctionType]
        assert program.module()(torch.ones(2, 4)).shape == (2, 2)
        _train(model, opt, 3)
        assert recorder.switch.on
        assert recorder.tables["steps"].snapshot().rows == 6
