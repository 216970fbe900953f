"""The tensor census, census differences and the batch-size finder, in-process on real tensors;
and how close the autocast and checkpointing estimates come to measurement (docs/memory.md)."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor.memory.batch_size import find_max_batch_size
from torchdoctor.memory.census import take_census
from torchdoctor.memory.estimate import (
    Breakdown,
    Situation,
    estimate_autocast,
    estimate_checkpointing,
)
from torchdoctor.memory.holders import census_diff, grew_by_kind

MiB = 1024**2


def _nbytes(tensors: object) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)  # type: ignore[attr-defined]


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8), nn.BatchNorm1d(8))
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        optimizer.zero_grad(set_to_none=False)
        model(torch.randn(16, 32)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def _by(census: object, kind: str, names: set[str]) -> int:
    return sum(
        r.bytes
        for r in census.records  # type: ignore[attr-defined]
        if r.kind == kind and r.name in names
    )


def test_census_matches_the_model_and_optimizer_to_the_byte() -> None:
    model, optimizer = _trained()
    census = take_census([(model, "model")], [optimizer])
    # a Sequential's parameters are named with the model's name: `0.weight` alone says nothing
    names = {f"model.{n}" for n, _ in model.named_parameters()}
    assert _by(census, "parameter", names) == _nbytes(model.parameters())
    assert _by(census, "gradient", names) == _nbytes(p.grad for p in model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    state_names = {f"{k} of {n}" for n in names for k in ("step", "exp_avg", "exp_avg_sq")}
    assert _by(census, "optimizer_state", state_names) == _nbytes(state)
    buffers = {f"model.{n}" for n, _ in model.named_buffers()}
    assert _by(census, "buffer", buffers) == _nbytes(model.buffers())
    assert {"exp_avg of model.0.weight", "model.3.running_mean"} <= {r.name for r in census.records}
    assert "AdamW" in census.optimizers


def test_shared_storage_is_counted_once() -> None:
    tied = nn.Linear(8, 8)
    model = nn.ModuleDict({"a": tied, "b": nn.Linear(8, 8)})
    model["b"].weight = tied.weight  # tied weights: one storage
    view = tied.weight[:2]  # a view owns nothing
    big = torch.zeros(250_000)
    sliced = big[:10]  # a slice keeps its base tensor alive, and the base owns the storage
    small = torch.empty(0).set_(big.untyped_storage(), 0, (10,))  # no base: owns it all
    del big
    gc.collect()
    census = take_census(
        [(model, "model")], namespace={"view": view, "small": small, "sliced": sliced}
    )
    params = [r for r in census.records if r.kind == "parameter" and r.name in ("a.weight",)]
    assert len(params) == 1 and params[0].bytes == 8 * 8 * 4
    assert not any(r.name == "b.weight" and r.kind == "parameter" for r in census.records)
    named = {r.name: r for r in census.records if r.name}
    assert named["view"].bytes == 0
    assert named["base of sliced"].bytes + named["sliced"].bytes == 1_000_000
    assert named["base of sliced"].shape == (250_000,)
    assert named["small"].bytes + named["base of sliced"].bytes == 1_000_000


def test_activations_include_what_the_graph_saved() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 4))
    x = torch.randn(32, 64)
    out = model(x)  # the graph saves tanh's output (also the second Linear's input)
    gc.collect()
    census = take_census([(model, "model")], namespace={"out": out, "x": x})
    acts = [r for r in census.records if r.kind == "activation"]
    assert any(r.name == "out" and r.bytes == 32 * 4 * 4 for r in acts)
    assert any(r.shape == (32, 256) and r.bytes == 32 * 256 * 4 for r in acts)
    # At least these two: other tests in this process may leave graphs of their own alive.
    assert census.bytes_by_kind()["activation"] >= 32 * 256 * 4 + 32 * 4 * 4
    assert next(r for r in census.records if r.name == "x").kind == "other"
    del out


def test_census_diff_tells_what_grew() -> None:
    model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 1))
    kept: list[torch.Tensor] = []
    before = take_census([(model, "model")], namespace={"kept": kept})
    for _ in range(3):
        kept.append(model(torch.randn(16, 64)).mean())  # each keeps its graph
    after = take_census([(model, "model")], namespace={"kept": kept})
    grew = census_diff(before, after)
    # (other threads of this worker may make tensors meanwhile: the activation is among them)
    grown = [g for g in grew if g["kind"] == "activation"]
    assert grown and grown[0]["grew"] > 0
    assert grew_by_kind(before, after)["activation"] >= 3 * 16 * 512 * 4
    assert grew_by_kind(before, after).get("parameter", 0) == 0


def test_batch_size_finder_stops_at_a_real_oom() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cleanups = []

    def step(batch: int) -> None:
        optimizer.zero_grad()
        out = model(torch.randn(batch, 16))
        if batch > 37:  # past 37 the "activations" ask for 4 TiB: a real allocation failure
            out = out + torch.empty(2**42, dtype=torch.uint8).sum()
        out.mean().backward()
        optimizer.step()

    result = torchdoctor.find_max_batch_size(
        step, start=4, model=model, optimizer=optimizer, cleanup=lambda: cleanups.append(1)
    )
    assert result.max_batch_size == 37 and result.first_failure == 38
    assert [t.batch_size for t in result.tries] == [4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert not result.tries[4].ok and "can't allocate memory" in (result.tries[4].error or "")
    assert len(cleanups) >= len(result.tries) + 1  # before every try, and at the end
    step(37)  # the answer runs...
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        step(38)  # ...and the next size does not
    assert "37" in str(result)


def test_batch_size_finder_measures_peak_memory() -> None:
    per_sample = 4 * MiB

    def step(batch: int) -> None:
        held = torch.ones(batch * per_sample // 4)  # 4 MiB per sample, touched
        held.mul_(2)
        del held

    result = find_max_batch_size(step, start=2, max_memory=82 * MiB, device="cpu")
    assert result.max_batch_size == 20, [(t.batch_size, t.peak) for t in result.tries]
    assert result.first_failure == 21
    assert result.memory_per_sample is not None
    # Resident memory is what the CPU meter sees; the C allocator keeps freed pages of small
    # tries resident, so the fitted slope is close, not exact.
    assert abs(result.memory_per_sample - per_sample) < 0.12 * per_sample


def _saved_bytes(run: object, params: set[int]) -> int:
    """Activation memory as autograd holds it: unique storages saved for backward, parameters
    left out (a bf16 copy of a weight made by autocast is a new storage and counts)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t.detach()  # returning `t` itself would tie the graph in a reference cycle

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()  # type: ignore[operator]
    del out
    return sum(storages.values())


class _TokenMlp(nn.Module):
    """Residual MLP blocks over a sequence: activations grow with batch x tokens."""

    def __init__(self, width: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean(1))


def _autocast_case(model: nn.Module, x: torch.Tensor) -> tuple[int, int, int | None]:
    """(measured fp32 activations, measured bf16 activations, estimated saving or None)."""
    torch.manual_seed(0)
    y = torch.randint(0, 10, (x.shape[0],))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def fp32() -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    def bf16() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return nn.functional.cross_entropy(model(x), y)

    measured_fp32 = _saved_bytes(fp32, params)
    measured_bf16 = _saved_bytes(bf16, params)
    gc.collect()
    loss = fp32()
    census = take_census([(model, "model")], namespace={"loss": loss, "x": x})
    acts = census.bytes_by_dtype("activation")
    situation = Situation(
        device="cpu",
        phase="backward",
        activation_dtypes=acts,
        float32_parameters=census.bytes_by_dtype("parameter").get("float32", 0),
    )
    # The census and the hooks agree on what autograd holds in float32 (the census calls the
    # input batch `other`; autograd saved it for the first Linear's weight gradient).
    held = sum(acts.values()) + x.numel() * x.element_size()
    assert abs(held - measured_fp32) <= 0.02 * measured_fp32
    fix = estimate_autocast(Breakdown(activations=sum(acts.values())), situation)
    del loss
    return measured_fp32, measured_bf16, (fix.saving if fix else None)


def test_autocast_estimate_against_measurement() -> None:
    """The estimate (half the float32 activations the census finds, less the 16-bit weight
    copies) against activation memory measured with and without bf16 autocast."""
    torch.manual_seed(0)
    # Activations dominate: 32 sequences of 128 tokens through 4 blocks 128 -> 512 -> 128.
    model = _TokenMlp(128, 512, 4)
    fp32, bf16, estimate = _autocast_case(model, torch.randn(32, 128, 128))
    measured = fp32 - bf16
    assert estimate is not None
    error = (estimate - measured) / measured
    print(
        f"\nautocast, tokens: fp32 {fp32}, bf16 {bf16}, saving {measured}, estimate "
        f"{estimate} ({error:+.1%})"
    )
    assert abs(error) <= 0.15
    # Weights dominate (a wide model, a small batch): autocast's weight copies cost more than
    # it saves, and the estimate offers no saving.
    wide = _TokenMlp(1024, 1024, 4)
    fp32, bf16, estimate = _autocast_case(wide, torch.randn(4, 16, 1024))
    print(f"autocast, wide: fp32 {fp32}, bf16 {bf16}, saving {fp32 - bf16}, estimate {estimate}")
    assert bf16 > fp32 and estimate is None


def test_checkpointing_estimate_against_measurement() -> None:
    """Per-block checkpointing: activations held after the forward with and without it."""
    from torch.utils.checkpoint import checkpoint

    blocks = nn.ModuleList(
        nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)) for _ in range(8)
    )
    x = torch.randn(128, 512, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in blocks.parameters()}

    def plain() -> torch.Tensor:
        h = x
        for block in blocks:
            h = block(h)
        return h.square().mean()

    def checkpointed() -> torch.Tensor:
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=True)
        return h.square().mean()

    full = _saved_bytes(plain, params)
    kept = _saved_bytes(checkpointed, params)
    gc.collect()
    loss = plain()
    census = take_census([(blocks, "blocks")], namespace={"loss": loss})
    count = census.count_by_kind()["activation"]
    held = census.bytes_by_kind()["activation"]
    s = Situation(device="cpu", phase="backward", layers=8, activation_tensors=count)
    fix = estimate_checkpointing(Breakdown(activations=held), s)
    assert fix is not None
    one_block = full / 8  # recomputed during the backward, one block at a time
    measured_saving = full - kept - one_block
    error = (fix.saving - measured_saving) / measured_saving
    print(
        f"\ncheckpointing: full {full}, kept {kept}, one block {one_block:.0f}; estimated "
        f"saving {fix.saving}, measured {measured_saving:.0f} ({error:+.1%})"
    )
    assert abs(error) <= 0.25
    del loss
