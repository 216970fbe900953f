"""Out-of-memory messages, fix estimates and the oom diagnosis: pure functions, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.diagnose.oom import from_evidence
from torchdoctor.memory.estimate import (
    Breakdown,
    Situation,
    estimate_autocast,
    estimate_checkpointing,
    plan_batch,
    rank_fixes,
    shortfall,
)
from torchdoctor.memory.evidence import OomEvidence
from torchdoctor.memory.oom import parse_message
from torchdoctor.units import human, parse_size

GiB, MiB = 1024**3, 1024**2

OLD_CUDA = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total "
    "capacity; 76.28 GiB already allocated; 1.45 GiB free; 77.50 GiB reserved in total by "
    "PyTorch)"
)
NEW_CUDA = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 7.79 GiB of which 3.19 MiB is free. Including non-PyTorch memory, this process "
    "has 7.77 GiB memory in use. Of the allocated memory 7.06 GiB is allocated by PyTorch, and "
    "64.17 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
    "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
OTHER_PROCESS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a total "
    "capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 has 91.82 GiB memory in "
    "use. Of the allocated memory 90.63 GiB is allocated by PyTorch, and 120.54 MiB is reserved "
    "by PyTorch but unallocated."
)
CPU = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: you tried to allocate 4398046511104 bytes. Error code 12 (Cannot "
    "allocate memory)"
)
CPU_OLD = (
    "RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: not enough "
    "memory: you tried to allocate 40000000000 bytes."
)


def test_units() -> None:
    assert human(1536) == "1.50 KiB" and human(2 * GiB) == "2.00 GiB" and human(12) == "12 bytes"
    assert parse_size("2GiB") == 2 * GiB and parse_size("300M") == 300 * MiB
    assert parse_size("512 MB") == 512 * MiB and parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("lots")


def test_old_cuda_message() -> None:
    m = parse_message(OLD_CUDA)
    assert m is not None and m.device == "cuda" and m.gpu == 0
    assert m.asked == 2 * GiB
    assert m.total == round(79.35 * GiB) and m.allocated == round(76.28 * GiB)
    assert m.free == round(1.45 * GiB) and m.reserved == round(77.50 * GiB)


def test_new_cuda_message() -> None:
    m = parse_message(NEW_CUDA)
    assert m is not None and m.device == "cuda" and m.gpu == 0
    assert m.asked == 20 * MiB
    assert m.total == round(7.79 * GiB) and m.free == round(3.19 * MiB)
    assert m.process == round(7.77 * GiB) and m.allocated == round(7.06 * GiB)
    assert m.reserved == round(7.06 * GiB) + round(64.17 * MiB)


def test_cuda_message_with_another_process_and_zero_free() -> None:
    m = parse_message(OTHER_PROCESS)
    assert m is not None and m.gpu == 1 and m.asked == round(1.25 * GiB)
    assert m.allocated == round(90.63 * GiB) and m.process is None
    zero = "CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 10.76 GiB total capacity; "
    zero += "9.46 GiB already allocated; 0 bytes free; 9.60 GiB reserved in total by PyTorch)"
    m = parse_message(zero)
    assert m is not None and m.free == 0 and m.reserved == round(9.60 * GiB)


def test_cpu_messages() -> None:
    m = parse_message(CPU)
    assert m is not None and m.device == "cpu" and m.asked == 2**42
    m = parse_message(CPU_OLD)
    assert m is not None and m.device == "cpu" and m.asked == 40_000_000_000
    m = parse_message(
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.00 GiB "
        "for an array with shape (20000, 20000) and data type float64"
    )
    assert m is not None and m.asked == 3 * GiB
    m = parse_message("RuntimeError: CUDA error: out of memory")
    assert m is not None and m.device == "cuda" and m.asked is None
    assert parse_message("RuntimeError: mat1 and mat2 shapes cannot be multiplied") is None


def _situation(**changes: object) -> Situation:
    base = Situation(
        device="cuda",
        asked=2 * GiB,
        capacity=80 * GiB,
        available=1 * GiB,
        phase="forward",
        batch_size=64,
        activation_dtypes={"float32": 40 * GiB},
        optimizer="AdamW",
        trainable_bytes=5 * GiB,
        layers=24,
        activation_tensors=24 * 12,
        largest_activation=1 * GiB,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def _breakdown(**changes: int) -> Breakdown:
    base = Breakdown(
        parameters=5 * GiB,
        gradients=5 * GiB,
        optimizer_state=10 * GiB,
        activations=40 * GiB,
        other=1 * GiB,
        cached_unused=3 * GiB,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def test_autocast_halves_float32_activations_only() -> None:
    b, s = _breakdown(), _situation()
    fix = estimate_autocast(b, s)
    assert fix is not None and fix.saving == (40 * GiB + 2 * GiB) // 2
    assert "21.00 GiB" in fix.text and "bfloat16" in fix.text
    # Already mostly bf16: nothing to gain.
    assert estimate_autocast(b, _situation(activation_dtypes={"bfloat16": 40 * GiB})) is None
    # Half float32: only that half halves.
    mixed = _situation(activation_dtypes={"float32": 20 * GiB, "bfloat16": 20 * GiB})
    assert estimate_autocast(b, mixed) is None  # 50% already 16-bit counts as on
    mostly = _situation(activation_dtypes={"float32": 30 * GiB, "bfloat16": 10 * GiB})
    fix = estimate_autocast(b, mostly)
    assert fix is not None and fix.saving == int(42 * GiB * 0.75) // 2


def test_checkpointing_uses_blocks_and_tensors_per_block() -> None:
    fix = estimate_checkpointing(_breakdown(), _situation())
    acts = 42 * GiB
    assert fix is not None and fix.saving == int(acts * (1 - 1 / 24 - 1 / 12))
    assert estimate_checkpointing(_breakdown(), _situation(layers=2)) is None


def test_batch_plan_keeps_the_effective_batch() -> None:
    b, s = _breakdown(), _situation()
    plan = plan_batch(b, s)
    assert plan is not None
    per_sample = (42 * GiB + 2 * 2 * GiB) / 64
    assert plan["per_sample"] == int(per_sample)
    fits = int((40 * GiB + 1 * GiB) * 0.9 // per_sample)
    assert plan["fits"] == fits
    assert plan["micro_batch"] * plan["accumulation"] == 64
    assert plan["micro_batch"] <= fits
    # A batch of one sample cannot be split; an unknown batch gives no plan.
    assert plan_batch(b, _situation(batch_size=1)) is None
    assert plan_batch(b, _situation(batch_size=None)) is None


def test_ranked_by_saving_with_enough_flags() -> None:
    b, s = _breakdown(), _situation()
    fixes = rank_fixes(b, s)
    codes = [f.code for f in fixes]
    assert codes[:3] == ["checkpointing", "batch_size", "autocast"]
    assert set(codes) >= {"autocast", "checkpointing", "optimizer_8bit", "expandable_segments"}
    assert "set_to_none" in codes  # 5 GiB of gradients held in the forward
    savings = [f.saving for f in fixes]
    assert savings == sorted(savings, reverse=True)
    missing = shortfall(b, s)
    assert missing == 1 * GiB
    assert all(f.enough == (f.saving >= missing) for f in fixes)
    eight_bit = next(f for f in fixes if f.code == "optimizer_8bit")
    assert eight_bit.saving == int(10 * GiB * 0.75) and "75%" in eight_bit.text
    # No FSDP suggestion: 20 GiB of model state is a quarter of 80 GiB.
    assert "sharding" not in codes


def test_sharding_when_model_state_dominates() -> None:
    b = _breakdown(parameters=20 * GiB, gradients=20 * GiB, optimizer_state=40 * GiB)
    s = _situation(capacity=80 * GiB, devices=8)
    fix = next(f for f in rank_fixes(b, s) if f.code == "sharding")
    assert fix.saving == int(80 * GiB * (1 - 1 / 8))


def test_a_sharded_model_is_planned_per_rank_with_room_for_one_all_gather() -> None:
    # Already sharded over 8 ranks: no sharding advice, whatever the state's share.
    b = _breakdown(parameters=20 * GiB, gradients=20 * GiB, optimizer_state=40 * GiB)
    sharded = _situation(capacity=80 * GiB, devices=8, world=8)
    assert "sharding" not in [f.code for f in rank_fixes(b, sharded)]
    # FSDP2's largest unit (4 GiB whole) still to come takes room from the batch plan; the part
    # of it held whole at the failure (1 GiB) is in the breakdown already.
    plain = plan_batch(_breakdown(), _situation())
    gathering = plan_batch(_breakdown(), _situation(world=8, all_gather=4 * GiB, gathered=GiB))
    assert plain is not None and gathering is not None
    assert abs(plain["room"] - gathering["room"] - 3 * GiB * 0.9) <= 1


def test_impossible_request_comes_first_and_hides_trivia() -> None:
    b = Breakdown(parameters=MiB, gradients=MiB, optimizer_state=2 * MiB, activations=MiB)
    s = Situation(
        device="cpu",
        asked=2**42,
        capacity=20 * GiB,
        available=19 * GiB,
        phase="forward",
        batch_size=16,
        optimizer="Adam",
        layers=4,
    )
    fixes = rank_fixes(b, s)
    assert fixes[0].code == "allocation" and "4.00 TiB" in fixes[0].text
    assert fixes[0].enough is None
    assert len(fixes) == 1  # megabyte savings against a 4 TiB request are noise


def test_from_evidence_builds_the_diagnosis() -> None:
    evidence = {
        "device": "cuda:0",
        "asked": 20 * MiB,
        "step": 7,
        "phase": "backward",
        "module": "encoder.layers.3.attn",
        "module_type": "Attention",
        "location_source": "traceback",
        "breakdown": {
            "parameters": 2 * GiB,
            "gradients": 2 * GiB,
            "optimizer_state": 4 * GiB,
            "buffers": 0,
            "activations": 3 * GiB,
            "other": 10 * MiB,
            "cached_unused": 512 * MiB,
        },
        "situation": {
            "device": "cuda",
            "asked": 20 * MiB,
            "capacity": 12 * GiB,
            "available": 3 * MiB,
            "phase": "backward",
            "batch_size": 32,
            "activation_dtypes": {"float32": 3 * GiB},
            "optimizer": "Adam",
            "trainable_bytes": 2 * GiB,
            "layers": 12,
            "unknown_field": "ignored",
        },
    }
    d = from_evidence(OomEvidence.from_json(evidence))
    assert d.kind == "oom" and d.severity == "error"
    assert d.location == "encoder.layers.3.attn" and d.step == 7
    assert "backward of encoder.layers.3.attn" in d.summary and "20.00 MiB" in d.summary
    assert "optimizer state 4.00 GiB" in d.summary and "cached but unused 512.00 MiB" in d.summary
    assert d.fix and all("≈" in line for line in d.fix)
    codes = [f.code for f in d.evidence.fixes]
    assert "expandable_segments" in codes and "optimizer_8bit" in codes
    assert d.evidence.shortfall == 17 * MiB
    json.loads(d.row()[7])  # the evidence column is strict JSON


def test_from_evidence_without_a_module_names_the_line() -> None:
    d = from_evidence(
        OomEvidence.from_json(
            {"device": "cpu", "asked": None, "phase": "backward", "file": "train.py", "line": 42}
        )
    )
    assert d.location == "train.py:42" and d.fix


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "explain"


@pytest.mark.parametrize(
    "path",
    # exception messages and single-process logs: what the live capture is given (a torchrun
    # log with several ranks' errors is explain's alone)
    sorted(
        p
        for d in ("oom.cuda", "oom.mps")
        for p in (FIXTURES / d).glob("*.txt")
        if "[rank" not in p.read_text()
    ),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_live_capture_reads_every_oom_message_as_explain_does(path: Path) -> None:
    """One grammar: the live capture's fields are the ones `explain` reads from the text."""
    from torchdoctor.errors.api import explain_text

    text = path.read_text()
    expected = explain_text(text).fields
    m = parse_message(text)
    assert m is not None, "the live capture does not recognise this message"
    pairs = {"asked": m.asked, "total": m.total, "free": m.free, "reserved": m.reserved}
    if path.parent.name == "oom.mps":
        pairs = {"asked": m.asked, "max_allowed": m.allowed}
    for name, value in pairs.items():
        assert value == expected.get(f"{name}_bytes"), name
