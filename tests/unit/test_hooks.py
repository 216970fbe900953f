"""Hooks are installed only while needed and always removed: in-process, on a real model."""

from __future__ import annotations

import shutil
import tempfile

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils.data import dataloader

import torchdoctor


@pytest.fixture
def probe(monkeypatch, tmp_path, uncompiled):  # type: ignore[no-untyped-def]
    sockets = tempfile.mkdtemp(prefix="td-")
    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", sockets + "/s")
    session = torchdoctor.start(run_dir=str(tmp_path / "run"), quiet=True, trace_every=4)
    yield session
    session.stop()
    shutil.rmtree(sockets, ignore_errors=True)


def _train(steps: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_global_module_hooks_only_on_discovery_and_traced_steps(probe) -> None:  # type: ignore[no-untyped-def]
    recorder = probe.telemetry
    assert module_hooks._global_forward_pre_hooks  # discovery: the first step finds the models
    _train(1)
    assert recorder.step == 1 and recorder.tracing  # step 1 is traced (one in 4, from step 1)
    assert module_hooks._global_forward_pre_hooks
    _train(1)
    assert not recorder.tracing
    assert not module_hooks._global_forward_pre_hooks  # untraced steps: models' pre-hooks only
    assert not module_hooks._global_forward_hooks


def test_stop_removes_every_hook_and_patch(probe) -> None:  # type: ignore[no-untyped-def]
    originals = (
        torch.autograd.backward.__wrapped__,
        torch.nn.utils.clip_grad_norm_.__wrapped__,
    )
    _train(6)
    assert probe.tables["steps"].snapshot().rows == 6
    probe.stop()
    assert torch.autograd.backward is originals[0]
    assert torch.nn.utils.clip_grad_norm_ is originals[1]
    assert not optimizer_hooks._global_optimizer_pre_hooks
    assert not optimizer_hooks._global_optimizer_post_hooks
    assert not module_hooks._global_forward_pre_hooks
    assert "torchdoctor" not in repr(dataloader._BaseDataLoaderIter.__next__.__code__)
    _train(2)  # training afterwards is untouched and unrecorded
    assert probe.tables["steps"].snapshot().rows == 6


def test_a_failing_hook_switches_telemetry_off_not_the_training(probe, capsys) -> None:  # type: ignore[no-untyped-def]
    recorder = probe.telemetry

    def broken(*_args: object) -> None:
        raise ValueError("planted")

    recorder.updates.check_primary = broken
    _train(3)  # no exception reaches the loop
    assert not recorder.switch.on
    assert "switched off" in capsys.readouterr().err


def test_no_global_hooks_after_discovery_when_tracing_is_off(probe) -> None:  # type: ignore[no-untyped-def]
    probe.configure(trace_every=0)
    model = _train(1)
    assert [m for m, _label in probe.telemetry.models.models()] == [
        model
    ]  # the model was found on the first step
    assert not module_hooks._global_forward_pre_hooks
    assert not module_hooks._global_forward_hooks
