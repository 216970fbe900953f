"""The census and the out-of-memory capture of a sharded model (FSDP2), in-process: rank 1 of a
world of 4 on torch's fake process group, which gives every rank's shapes and placements in one
process without communicating (its collectives' data is garbage: only memory is read here).
The real jobs, on gloo under torchrun, are tests/integration/test_sharded.py."""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from torchdoctor.diagnose.oom import from_evidence
from torchdoctor.memory.census import take_census
from torchdoctor.memory.oom import capture, find_oom
from torchdoctor.report.memory import render_oom
from torchdoctor.store.schema import TENSORS
from torchdoctor.units import human

WORLD = 4
UP, DOWN = (16 * 32 + 32) * 4, (32 * 4 + 4) * 4  # bytes of the two units' parameters, whole
MODEL = UP + DOWN
CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 4398046511104 bytes. Error code 12 (Cannot allocate memory)"
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.down = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


@pytest.fixture(scope="module")
def mesh() -> Iterator[object]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        yield init_device_mesh("cpu", (WORLD,))
    finally:
        dist.destroy_process_group()


def _sharded(mesh: object) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    fully_shard(model.up, mesh=mesh)
    fully_shard(model.down, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _elsewhere() -> tuple[dict[str, int], dict[str, int]]:
    """What the census finds before the test builds its model: the parameters of earlier
    tests' models still alive in this worker (the census reads every live tensor)."""
    gc.collect()  # the models of earlier tests (FSDP2's state holds reference cycles)
    before = take_census([], [])
    return before.bytes_by_kind(), before.total_by_kind()


def test_each_kind_is_this_ranks_shard_of_the_whole(mesh: object) -> None:
    # (That the census issues no collective is counted on gloo: the fake group shows none.)
    held_before, whole_before = _elsewhere()
    model = _sharded(mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    census = take_census([(model, "model")], [optimizer])
    held = {k: v - held_before.get(k, 0) for k, v in census.bytes_by_kind().items()}
    whole = {k: v - whole_before.get(k, 0) for k, v in census.total_by_kind().items()}
    scalars = 4 * 4  # AdamW's `step` of each parameter: a plain float32 scalar
    assert (held["parameter"], whole["parameter"]) == (MODEL // WORLD, MODEL)
    assert (held["gradient"], whole["gradient"]) == (MODEL // WORLD, MODEL)
    assert held["optimizer_state"] == 2 * MODEL // WORLD + scalars
    assert whole["optimizer_state"] == 2 * MODEL + scalars
    assert census.sharded_world() == WORLD
    weight = next(r for r in census.records if r.kind == "parameter" and r.name == "up.weight")
    assert (weight.shape, weight.bytes, weight.total_bytes) == ((32, 16), 512, 2048)
    assert (weight.placements, weight.unit, weight.world) == ("Shard(dim=0)", "up", WORLD)
    assert len(weight.row()) == len(TENSORS.columns)
    # A local shard is its DTensor's row, not an "other" tensor of its own; FSDP2's freed
    # unsharded parameters (no storage) are left out.
    assert sum(r.kind == "parameter" and r.world == WORLD for r in census.records) == 4
    assert not [r for r in census.records if r.kind == "other" and r.shape == (8, 16)][1:]
    assert [(u.name, u.unsharded, u.gathered) for u in census.units] == [
        ("up", UP, 0),
        ("down", DOWN, 0),
    ]


def test_an_oom_in_a_units_forward_counts_its_all_gather(mesh: object) -> None:
    held_before, whole_before = _elsewhere()
    model = _sharded(mesh)

    def fail(module: nn.Module, args: object) -> None:  # `down` is all-gathered by now
        raise RuntimeError(CPU_OOM)

    model.down.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(8, 16))
    found = find_oom(info.value)
    assert found is not None
    evidence = capture(*found, None)
    # This rank's shards (a quarter) plus `down` held whole while its forward runs.
    assert evidence.breakdown.parameters - held_before.get("parameter", 0) == MODEL // WORLD + DOWN
    s = evidence.situation
    assert (s.world, s.all_gather, s.all_gather_unit, s.gathered) == (WORLD, UP, "up", DOWN)
    assert evidence.sharding is not None
    total = evidence.sharding.total["parameter"] - whole_before.get("parameter", 0)
    assert total == MODEL  # the gathered copy not twice
    diagnosis = from_evidence(evidence)
    # (the figures said are the process's, with the models earlier tests left in this worker:
    # they are checked above, net of those)
    size = r"[\d.]+ [KMGT]?i?B"
    said = rf"local shards: {size} of {size} total \(world {WORLD}\)"
    assert re.search(said, diagnosis.summary), diagnosis.summary
    assert f"the largest, up, {human(UP)}" in diagnosis.summary
    text = render_oom(diagnosis.evidence)
    assert f"this rank of {WORLD}" in text
    assert re.search(rf"local shard of {size} total \(world {WORLD}\)", text), text
    assert "all-gather peak" in text and human(UP) in text
