"""One recogniser of out-of-memory texts (errors/oom_message.py): explain's catalog, the live OOM
capture and the batch-size finder (in-process and `torchdoctor batch-size`) all ask it.

The messages are the wordings PyTorch and its libraries print (from the explain corpus, real
texts of public issue threads, and from the allocators' sources); the negatives are texts the
old substring test of the batch-size finder took for out-of-memory errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.errors import oom_message
from torchdoctor.errors.api import explain_text
from torchdoctor.errors.oom_message import is_oom, is_oom_text
from torchdoctor.memory import batch_size

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "explain_corpus"

OOM = [
    # CUDA, every wording since 1.0
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB total "
    "capacity; 4.36 GiB already allocated; 6.69 MiB free; 4.63 GiB reserved in total by PyTorch)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 12.75 MiB is free.",
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: CUDA error:out of memory",
    "RuntimeError: cuda runtime error (2) : out of memory at "
    "/pytorch/aten/src/THC/THCCachingAllocator.cpp:510",
    # ROCm and XPU
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 23.98 GiB of which 1.37 GiB is free.",
    "RuntimeError: XPU out of memory. Tried to allocate 1.00 GiB",
    # MPS
    "RuntimeError: MPS backend out of memory (MPS allocated: 2.44 GB, other allocations: 4.34 GB, "
    "max allowed: 6.77 GB). Tried to allocate 10.58 MB on private pool.",
    # host memory
    "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough "
    "memory: you tried to allocate 17179869184 bytes.",
    "[enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: you "
    "tried to allocate 278528000 bytes. Error code 12 (Cannot allocate memory)",
    "RuntimeError: [enforce fail at CPUAllocator.cpp:56] posix_memalign(&data, gAlignment, "
    "nbytes) == 0. 12 vs 0",
    "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array with "
    "shape (1000000, 1000) and data type float64",
    "MemoryError",
    "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc",
    "OSError: [Errno 12] Cannot allocate memory",
    "OSError: [WinError 1455] The paging file is too small for this operation to complete.",
    "[Tue Mar  4 10:02:11 2025] Out of memory: Killed process 4242 (python) total-vm:98765432kB",
    # a library's own allocation
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "NCCL error in: NCCLUtils.hpp:219, unhandled cuda error\nLast error:\n"
    "Cuda failure 'out of memory'",
]

NOT_OOM = [
    "IndexError: list index out of range",
    "RuntimeError: CUDA error: device-side assert triggered",
    "OSError: /usr/lib/aarch64-linux-gnu/libgomp.so.1: cannot allocate memory in static TLS block",
    "RuntimeError: could not create a primitive",  # oneDNN, no memory limit: not an allocation
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)",
]


@pytest.mark.parametrize("text", OOM)
def test_real_oom_messages_are_recognised(text: str) -> None:
    assert is_oom_text(text), text


@pytest.mark.parametrize("text", NOT_OOM)
def test_other_errors_are_not(text: str) -> None:
    assert not is_oom_text(text), text


def test_onednn_counts_only_under_a_memory_limit() -> None:
    # `torchdoctor batch-size` runs each try under RLIMIT_AS: oneDNN then reports the failed
    # allocation as a primitive it could not create.
    assert is_oom_text("RuntimeError: could not create a primitive", limited=True)
    assert not is_oom_text("RuntimeError: could not create a primitive")


def test_exceptions_by_class_and_by_cause() -> None:
    class OutOfMemoryError(RuntimeError):
        pass

    assert is_oom(MemoryError())
    assert is_oom(OutOfMemoryError("anything"))
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError as inner:
            raise ValueError("the step failed") from inner
    except ValueError as outer:
        assert is_oom(outer)
    assert not is_oom(KeyError("label"))


def test_batch_size_finder_asks_the_one_recogniser() -> None:
    assert batch_size.is_oom is oom_message.is_oom
    assert not hasattr(batch_size, "OOM_MARKERS")


def _corpus(category: str) -> list[str]:
    out = []
    for path in sorted(CORPUS.glob(f"{category}--*.txt")):
        lines = path.read_text(encoding="utf-8").splitlines()
        out.append("\n".join(x for x in lines if not x.startswith("# ")))
    return out


@pytest.mark.parametrize("category", ["oom.cuda", "oom.cpu", "oom.mps", "cublas.alloc"])
def test_every_oom_text_of_the_corpus_is_recognised(category: str) -> None:
    texts = _corpus(category)
    assert texts
    for text in texts:
        assert is_oom_text(text), text[-300:]


@pytest.mark.parametrize("category", ["shape.matmul", "dtype.mismatch", "index.out_of_range"])
def test_no_text_of_other_categories_is(category: str) -> None:
    for text in _corpus(category):
        assert not is_oom_text(text), text[-300:]


def test_explain_and_the_recogniser_agree_on_the_device() -> None:
    # Every message explain files under an OOM category is one the recogniser knows, and the
    # device it parses is the category's.
    for text, category, device in (
        (OOM[0], "oom.cuda", "cuda"),
        (OOM[5], "oom.cuda", "cuda"),
        (OOM[7], "oom.mps", "mps"),
        (OOM[8], "oom.cpu", "cpu"),
    ):
        assert explain_text(text).category == category
        parsed = oom_message.parse(text)
        assert parsed is not None and parsed.device == device
