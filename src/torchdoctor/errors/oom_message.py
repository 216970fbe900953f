"""The grammar of out-of-memory messages, torch-free: which wording is an OOM of which device,
and the numbers each wording carries. `torchdoctor explain` (errors/memory.py) and the live
OOM capture (memory/oom.py) both read messages through it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torchdoctor.errors.catalog import Fields, all_of, first
from torchdoctor.units import SIZE, human, size_in

# An exception or log line that says an allocation failed, by device.
GPU_PATTERNS = (
    r"\b(?:CUDA|HIP|XPU) out of memory",
    r"CUDA error: ?out of memory",
    r"cudaErrorMemoryAllocation",
    r"\bOutOfMemoryError\b",
)
CPU_PATTERNS = (
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)",
    r"\b(?:_ArrayMemoryError|MemoryError)\b",
    r"Unable to allocate \S+ \S+ for an array with shape",
    r"std::bad_alloc",
    r"posix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0",  # ENOMEM, torch <= 1.1
)
MPS_PATTERNS = (r"MPS backend out of memory",)


def _put(fields: Fields, name: str, size_text: str | None) -> None:
    if size_text is None:
        return
    value = size_in(size_text)
    if value is not None:
        fields[name] = " ".join(size_text.split())
        fields[f"{name}_bytes"] = value


def _put_bytes(fields: Fields, name: str, value: int) -> None:
    fields[name] = human(value)
    fields[f"{name}_bytes"] = value


def gpu_fields(message: str, text: str = "") -> Fields:
    """CUDA, ROCm (HIP) and XPU: every wording PyTorch has used since 1.0."""
    f: Fields = {}
    _put(f, "asked", first(rf"Tried to allocate ({SIZE})", message))
    gpu = first(r"\bGPU (\d+)\b", message)
    if gpu is not None:
        f["gpu"] = int(gpu)
    _put(f, "total", first(rf"({SIZE}) total capacity", message))
    _put(f, "total", first(rf"total capacity of ({SIZE})", message))
    _put(f, "allocated", first(rf"({SIZE}) already allocated", message))
    _put(f, "allocated", first(rf"allocated memory ({SIZE}) is allocated by PyTorch", message))
    _put(f, "free", first(rf"({SIZE}) free\b", message))
    _put(f, "free", first(rf"of which ({SIZE}) is free", message))
    _put(f, "reserved", first(rf"({SIZE}) reserved in total by PyTorch", message))
    _put(f, "cached", first(rf"({SIZE}) cached\b", message))  # PyTorch 1.0 wording
    unallocated = first(rf"({SIZE}) is reserved by PyTorch but unallocated", message)
    _put(f, "process_in_use", first(rf"this process has ({SIZE}) memory in use", message))
    _put(f, "allowed", first(rf"({SIZE}) allowed;", message))  # a per-process fraction cap
    if "reserved" not in f and unallocated is not None and "allocated_bytes" in f:
        _put_bytes(f, "reserved", f["allocated_bytes"] + (size_in(unallocated) or 0))
    if "reserved_bytes" in f and "allocated_bytes" in f:
        spare = f["reserved_bytes"] - f["allocated_bytes"]
        if spare >= 0:
            _put_bytes(f, "reserved_minus_allocated", spare)
    if {"total_bytes", "free_bytes", "reserved_bytes"} <= f.keys():
        outside = f["total_bytes"] - f["free_bytes"] - f["reserved_bytes"]
        if outside >= 0:
            _put_bytes(f, "outside_pytorch", outside)
    processes = [(m.group(1), m.group(2)) for m in all_of(rf"Process (\d+) has ({SIZE})", message)]
    if processes:
        f["processes"] = ", ".join(f"pid {pid}: {size}" for pid, size in processes)
        f["process_count"] = len(processes)
    return f


def cpu_fields(message: str, text: str = "") -> Fields:
    f: Fields = {}
    asked = first(r"you tried to allocate (\d+) bytes", message)
    if asked is not None:
        _put_bytes(f, "asked", int(asked))
    _put(f, "asked", first(rf"Unable to allocate ({SIZE}) for an array", message))
    shape = first(r"for an array with shape (\([\d, ]*\))", message)
    if shape:
        f["array_shape"] = shape
    if first(
        r"(exitcode\s*:\s*-9|Signal 9 \(SIGKILL\)|exit(?:ed with)? (?:code|status) 137)", text
    ):
        f["signal"] = "SIGKILL"
    return f


def mps_fields(message: str, text: str = "") -> Fields:
    f: Fields = {}
    _put(f, "mps_allocated", first(rf"MPS allocated: ({SIZE})", message))
    _put(f, "other_allocations", first(rf"other allocations: ({SIZE})", message))
    _put(f, "max_allowed", first(rf"max allowed: ({SIZE})", message))
    _put(f, "asked", first(rf"Tried to allocate ({SIZE})", message))
    return f


@dataclasses.dataclass
class OomMessage:
    """The numbers of one out-of-memory message (bytes; None where the wording has none)."""

    device: str  # "cuda" (ROCm too), "xpu", "cpu" or "mps"
    asked: int | None = None
    gpu: int | None = None
    total: int | None = None  # device capacity
    free: int | None = None  # free on the device (CUDA API) when it failed
    allocated: int | None = None  # by PyTorch's allocator
    reserved: int | None = None  # by PyTorch's allocator in total
    allowed: int | None = None  # the per-process cap, when the message gives it
    process: int | None = None  # this process, non-PyTorch memory included
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _matches(patterns: tuple[str, ...], text: str) -> bool:
    return any(re.search(p, text, re.IGNORECASE) for p in patterns)


def parse(text: str) -> OomMessage | None:
    """The out-of-memory message in `text` (an exception's message), or None."""
    first_line = text.strip().splitlines()[0][:500] if text.strip() else ""
    if _matches(MPS_PATTERNS, text):
        f = mps_fields(text)
        return OomMessage(
            "mps", asked=f.get("asked_bytes"), allowed=f.get("max_allowed_bytes"), text=first_line
        )
    if _matches(GPU_PATTERNS, text):
        f = gpu_fields(text)
        device = "xpu" if re.search(r"\bXPU out of memory", text) else "cuda"
        return OomMessage(
            device,
            asked=f.get("asked_bytes"),
            gpu=f.get("gpu"),
            total=f.get("total_bytes"),
            free=f.get("free_bytes"),
            allocated=f.get("allocated_bytes"),
            reserved=f.get("reserved_bytes"),
            allowed=f.get("allowed_bytes"),
            process=f.get("process_in_use_bytes"),
            text=first_line,
        )
    if _matches(CPU_PATTERNS, text):
        return OomMessage("cpu", asked=cpu_fields(text).get("asked_bytes"), text=first_line)
    return None
