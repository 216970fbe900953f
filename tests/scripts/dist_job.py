"""A small DistributedDataParallel job on gloo, for the tests of ranks, job directories,
collectives and the ends of a rank.

    torchrun --nproc_per_node=N dist_job.py [OPTIONS]      ranks from torchrun's environment
    python dist_job.py --spawn N --port P [OPTIONS]        ranks from torch.multiprocessing.spawn
                       [--start-method fork]                 (or forked: the fork of a probed
                                                              launcher starts a probe of its own)
    python dist_job.py --rank R --world N --port P         a rank that says who it is itself

Each step: DDP forward/backward (DDP's own gradient all-reduce), optimizer step, then the
script's own all_reduce of the loss. Options:
  --steps N        steps to run (default 4)
  --until-stop     after the steps, keep stepping until a file named "stop" appears
  --mismatch R     at step 2 rank R all-reduces a tensor of another size: gloo aborts a rank
  --kill R         at step 2 rank R kills itself with SIGKILL
  --wait R         at step 2 rank R writes "waiting" and sleeps (to be signalled)
  --handler        install a SIGTERM handler that prints and exits 3
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--until-stop", action="store_true")
    p.add_argument("--mismatch", type=int, default=-1)
    p.add_argument("--kill", type=int, default=-1)
    p.add_argument("--wait", type=int, default=-1)
    p.add_argument("--handler", action="store_true")
    p.add_argument("--spawn", type=int, default=0)
    p.add_argument("--start-method", default="spawn", choices=["spawn", "fork"])
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--world", type=int, default=0)
    p.add_argument("--port", default="")
    return p.parse_args()


def say(line: str) -> None:
    # One write per line: the ranks share one stdout, and under PYTHONUNBUFFERED print()
    # writes the text and its newline separately, so two ranks' lines could interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(rank: int, args: argparse.Namespace) -> None:
    if args.handler:

        def on_term(signum: int, frame: object) -> None:
            say(f"rank {rank} caught {signal.Signals(signum).name}")
            sys.exit(3)

        signal.signal(signal.SIGTERM, on_term)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    step = 0
    while step < args.steps or (args.until_stop and not os.path.exists("stop")):
        x, y = torch.randn(8, 6), torch.randn(8, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        report = loss.detach().clone()
        if step == 2 and rank == args.mismatch:
            report = torch.zeros(64)  # the bug: another size than the other ranks'
        if step == 2 and rank == args.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == 2 and rank == args.wait:
            with open(f"waiting{rank}", "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)
        dist.all_reduce(report)
        step += 1
        if args.until_stop and step >= args.steps:
            time.sleep(0.05)
    say(f"rank {rank} done after {step} steps")


def spawned(rank: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=args.spawn)
    train(rank, args)
    dist.destroy_process_group()


def main() -> None:
    args = parse()
    if args.spawn:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = args.port
        mp.start_processes(
            spawned, args=(args,), nprocs=args.spawn, join=True, start_method=args.start_method
        )
        return
    if args.rank >= 0:
        url = f"tcp://127.0.0.1:{args.port}"
        dist.init_process_group("gloo", init_method=url, rank=args.rank, world_size=args.world)
    else:
        dist.init_process_group("gloo")
    train(dist.get_rank(), args)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
