"""Cost of collective tracing (python.collectives) on a 2-rank gloo DDP job, paired in one run.

Each rank runs the full probe; blocks of steps alternate between the c10d kernels registered
(every all-reduce recorded and written through to the run directory) and dropped, in the same
order on both ranks. Reported: rank 0's median step time untraced and the median of the
per-round ratios traced/untraced (with their quartiles: the machine's noise, and a bootstrap
95% interval of that median: how far the machine's noise may have moved it). Budget
(docs/benchmarks.md): <= 1.01. Then, as a figure that noise barely moves, the cost per call on
a 1-rank group, twice: in a tight loop (best of 5), and with the caches cold as in the job
(each call after streaming 32 MB through them, as a backward pass does; median), and what each
comes to for the job's calls per step. The kernel is the C++ one where it is built (`python -m
torchdoctor.native`) unless TORCHDOCTOR_NATIVE=0, else the Python one; `--kernel` chooses.

    .venv/bin/python benchmarks/ddp_overhead.py [--blocks N] [--width W] [--kernel native|python]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _interleave import interleave, median_interval
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchdoctor
from torchdoctor import native
from torchdoctor.telemetry import collectives


@contextlib.contextmanager
def kernels(on: bool) -> Iterator[None]:
    collectives.set_kernels(on)
    try:
        yield
    finally:
        collectives.set_kernels(True)


def rank_main(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    if args.pin:
        pin_to_core(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    probe = torchdoctor.start(run_dir=tempfile.mkdtemp(prefix="td-ddp-bench-"), quiet=True)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    w = args.width
    model = DistributedDataParallel(  # DDP's default 25 MB buckets
        nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1)),
        bucket_cap_mb=args.bucket_mb,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(args.batch, w), torch.randn(args.batch, 1)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        report = loss.detach()
        dist.all_reduce(report)  # the script's own: the logged mean loss

    ratios: dict[str, list[float]] = {}
    t = interleave(
        step,
        {"untraced": lambda: kernels(False), "traced": lambda: kernels(True)},
        blocks=args.blocks,
        steps_per_block=args.steps,
        ratios=ratios,
    )
    calls = len(probe.tables["collectives"])
    if rank == 0:
        q1, _, q3 = statistics.quantiles(ratios["traced"], n=4)
        lo, hi = median_interval(ratios["traced"])
        Path(out).write_text(f"{t['untraced']} {t['traced']} {calls} {q1} {q3} {lo} {hi}\n")
    dist.destroy_process_group()
    probe.stop()


def pin_to_core(rank: int) -> None:
    """This rank and every thread it has or will start (they inherit it) on core `rank`."""
    cores = sorted(os.sched_getaffinity(0))
    core = {cores[rank % len(cores)]}
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), core)


def per_call(_rank: int, port: int, out: str) -> None:
    """Microseconds per `all_reduce` of 1000 floats on a 1-rank gloo group, the kernels dropped,
    registered but passing through, and recording: in a tight loop (best of 5 runs of 2000),
    then with the caches cold (best of 3 medians of 300 calls, each after a pass over 32 MB)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    probe = torchdoctor.start(run_dir=tempfile.mkdtemp(prefix="td-ddp-bench-"), quiet=True)
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.randn(1000)

    big = torch.zeros(8 << 20)  # 32 MB: more than this machine's caches

    def hot() -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                dist.all_reduce(x)
            runs.append((time.perf_counter() - t0) / 2000 * 1e6)
        return min(runs)

    def cold() -> float:
        def one() -> float:
            big.add_(1.0)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            return time.perf_counter() - t0

        return min(statistics.median(one() for _ in range(300)) for _ in range(3)) * 1e6

    current = collectives._current[0]
    figures = []
    for measure in (hot, cold):
        collectives.set_kernels(False)
        figures.append(measure())  # dropped
        collectives.set_kernels(True)
        current.switch.on = False
        figures.append(measure())  # passing through
        current.switch.on = True
        figures.append(measure())  # recording
    Path(out).write_text(" ".join(map(str, figures)) + "\n")
    dist.destroy_process_group()
    probe.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    # many short rounds: the median of their ratios settles where a few long ones do not;
    # on a noisy 2-core machine 200 rounds put it within about +-0.7%
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    parser.add_argument(
        "--pin", action="store_true", help="each rank and its threads on a core of its own"
    )
    parser.add_argument(
        "--kernel", choices=("native", "python"), help="default: as TORCHDOCTOR_NATIVE says"
    )
    args = parser.parse_args()
    if args.kernel:
        os.environ["TORCHDOCTOR_NATIVE"] = "1" if args.kernel == "native" else "0"
        if args.kernel == "native" and native.built() is None:
            parser.error("the C++ kernel is not built: python -m torchdoctor.native")
    kernel = (
        "python" if os.environ.get("TORCHDOCTOR_NATIVE") == "0" or not native.built() else "C++"
    )
    os.environ.setdefault("TORCHDOCTOR_SOCKET_DIR", tempfile.mkdtemp(prefix="td-"))
    with socket_port() as port, tempfile.NamedTemporaryFile() as out:
        mp.spawn(rank_main, args=(args, port, out.name), nprocs=2, join=True)
        untraced, traced, calls, q1, q3, lo, hi = Path(out.name).read_text().split()
    base, ratio = float(untraced), float(traced) / float(untraced)
    steps = args.blocks * args.steps + 20  # the traced blocks and the warm-up
    print(
        f"torch {torch.__version__}, gloo, 2 ranks, {args.blocks} blocks x {args.steps} steps,"
        f" {kernel} kernel"
    )
    print(f"untraced step (rank 0, median): {base * 1e3:.2f} ms")
    print(f"collective tracing, traced/untraced (paired): {ratio:.4f}   budget <= 1.01")
    print(f"  per-round ratios, quartiles: {float(q1):.3f} .. {float(q3):.3f} (the noise)")
    print(f"  95% interval of the median ratio (bootstrap): {float(lo):.4f} .. {float(hi):.4f}")
    print(f"collectives recorded on rank 0: {calls} ({int(calls) / steps:.1f} per step)")
    with socket_port() as port, tempfile.NamedTemporaryFile() as out:
        mp.spawn(per_call, args=(port, out.name), nprocs=1, join=True)
        figures = list(map(float, Path(out.name).read_text().split()))
    for label, (dropped, passing, recording) in (
        ("tight loop", figures[:3]),
        ("caches cold", figures[3:]),
    ):
        extra = recording - dropped
        cost = extra * int(calls) / steps / (base * 1e6)
        print(
            f"per call, {label} (1 rank, 1000 floats): kernels dropped {dropped:.0f} us, "
            f"passing through {passing:.0f} us, recording {recording:.0f} us"
        )
        print(f"  hence for this job: {extra:.0f} us x calls per step / step time = {cost:.2%}")


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


if __name__ == "__main__":
    main()
