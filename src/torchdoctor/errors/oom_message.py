"""The grammar of out-of-memory messages, torch-free: which wording is an OOM of which device,
and the numbers each wording carries. The one place that decides "is this text an
out-of-memory error": `torchdoctor explain` (errors/memory.py), the live OOM capture
(memory/oom.py) and the batch-size finder (memory/batch_size.py, `torchdoctor batch-size`) all
read messages through it.
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
    r"cuda runtime error \(2\) ?: ?out of memory",  # torch <= 0.4
    r"cudaErrorMemoryAllocation|hipErrorOutOfMemory",
    r"\bOutOfMemoryError\b",
)
CPU_PATTERNS = (
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)",
    r"\b(?:_ArrayMemoryError|MemoryError)\b",
    r"Unable to allocate \S+ \S+ for an array with shape",
    r"std::bad_alloc",
    r"posix_memalign\(&data, gAlignment, nbytes\) == 0\. 12 vs 0",  # ENOMEM, torch <= 1.1
    # ENOMEM (a fork, an mmap), not glibc's "cannot allocate memory in static TLS block",
    # which is a library loaded too late, not a shortage.
    r"\bCannot allocate memory\b(?! in static TLS)",
    r"\[WinError (?:8|1455)\]",  # Windows: not enough memory resources; paging file too small
    # The kernel's word: the OOM killer, a cgroup's limit, Kubernetes.
    r"Out of memory: Kill(?:ed)? process",
    r"Memory cgroup out of memory",
    r"\bOOMKilled\b",
)
MPS_PATTERNS = (r"MPS backend out of memory",)
# A library's own allocation failing: an out-of-memory error of the device it runs on (cuBLAS
# creating its handle or workspace on a full GPU, NCCL its buffers); explain files these
# under the library (cublas.alloc, nccl.error).
LIBRARY_PATTERNS = (
    r"CUBLAS_STATUS_ALLOC_FAILED",
    r"Cuda failure '?out of memory",  # NCCL's report of its CUDA allocation
)
# Failures that are allocations only when the process runs under a memory limit (RLIMIT_AS in
# `torchdoctor batch-size`): oneDNN reports a failed allocation as a primitive it could not
# create, which otherwise also means an unsupported layout or dtype.
LIMITED_PATTERNS = (r"could not create a primitive", r"OpenBLAS[^\n]*memory allocation failed")
OOM_CLASSES = ("MemoryError", "OutOfMemoryError", "_ArrayMemoryError")


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


def is_oom_text(text: str, limited: bool = False) -> bool:
    """Whether `text` (an exception's message, a traceback or a process's stderr) says an
    allocation failed: on a GPU (CUDA, ROCm, XPU), on Apple's MPS, in host memory, or inside
    cuBLAS. With `limited` (the process ran under a memory limit), oneDNN's and OpenBLAS's
    failed allocations count too."""
    patterns: tuple[str, ...] = GPU_PATTERNS + MPS_PATTERNS + CPU_PATTERNS + LIBRARY_PATTERNS
    if limited:
        patterns += LIMITED_PATTERNS
    return _matches(patterns, text)


def is_oom(exc: BaseException, limited: bool = False) -> bool:
    """Whether an exception, or one it was raised from, is an out-of-memory error: by its class
    (MemoryError, torch's OutOfMemoryError) or by its message (is_oom_text)."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        names = {cls.__name__ for cls in type(current).__mro__}
        if names & set(OOM_CLASSES) or is_oom_text(str(current), limited):
            return True
        current = current.__cause__ or current.__context__
    return False


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
