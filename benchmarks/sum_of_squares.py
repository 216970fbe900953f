"""The gradient norm of a few small tensors: torchdoctor.native.sum_of_squares (one call into the
compiled module) against torch's flatten, norm and .item(), side by side in one process.

Each figure is the best of `--repeats` runs of `--calls` calls (the minimum: what a call costs
when nothing else interferes, which is what a busy machine moves least), in microseconds per
call. Also: what a ctypes call into a library costs compared to a function of a compiled module
(the mechanism sum_of_squares uses), measured on Python's own PyObject_Length against len().
Run: .venv/bin/python benchmarks/sum_of_squares.py [--shapes 1024,1024,512,512]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor import native


def best_us(call: Callable[[], Any], calls: int, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="1024,1024,512,512", help="elements per tensor")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if native.load() is None:
        raise SystemExit("not built: python -m torchdoctor.native")
    dtype = getattr(torch, args.dtype)
    grads = [torch.randn(int(n), dtype=dtype) for n in args.shapes.split(",")]
    flatten, norm = torch._C._nn.flatten_dense_tensors, torch.linalg.vector_norm
    squares = native.sum_of_squares
    ours, exact = squares(grads), float(sum(g.double().pow(2).sum() for g in grads))
    assert ours is not None and math.isclose(ours, exact, rel_tol=1e-12), (ours, exact)

    n, r = args.calls, args.repeats
    figures = {
        "native.sum_of_squares(grads)": best_us(lambda: squares(grads), n, r),
        "vector_norm(flatten_dense_tensors(grads)).item()": best_us(
            lambda: norm(flatten(grads)).item(), n, r
        ),
    }
    length = ctypes.pythonapi.PyObject_Length
    length.argtypes, length.restype = [ctypes.py_object], ctypes.c_ssize_t
    figures["ctypes call (PyObject_Length)"] = best_us(lambda: length(grads), n, r)
    figures["module function call (len)"] = best_us(lambda: len(grads), n, r)
    figures["(the lambda around each call)"] = best_us(lambda: None, n, r)
    total = sum(g.numel() for g in grads)
    print(f"{len(grads)} {args.dtype} tensors, {total} elements; best of {r} x {n} calls")
    for what, us in figures.items():
        print(f"  {us:8.2f} us  {what}")


if __name__ == "__main__":
    main()
