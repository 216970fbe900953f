"""A sharded job on gloo (CPU): FSDP2 (`fully_shard`) or tensor parallel
(`parallelize_module`), for the tests of DTensor-aware telemetry.

    torchrun --nproc_per_node=N dist_sharded.py [--tp] [--steps N] [--clip] [--count OUT]
                                                [--meta-init] [--no-zero-grad] [--log-act]

Each step: forward, backward (FSDP2's reduce-scatters), optionally clip_grad_norm_ (the
script's own collective on DTensor gradients), an AdamW step. `--count OUT` records every
collective the process issues (torch.profiler's c10d and functional-collective ops, whoever
calls them) and writes `op count` lines to OUT.rank<R>. `--twice RUN_DIR` trains once with no
probe, then starts torchdoctor (recording into RUN_DIR) and trains again, counting both: the
tests compare the two counts op for op (the same process, the same code, the same steps).
The probed pass also takes torchdoctor's tensor census after its last optimizer step (the
gradients still held), inside the counted region, and writes it to census.rank<R>.json: what
`torchdoctor PID memory` shows, as data and as text. `--meta-init` builds the FSDP2 model as
pytorch/examples' FSDP2 example does and keeps its bug: a layer never initialised.
`--no-zero-grad` never clears the gradients (FSDP2 then adds each step's to the last).
`--log-act` takes the log of the ReLU's output between the two layers (the tensor-parallel
planted bug of benchmarks/realworld: log(0) = -inf, then NaN from the first step).
"""

from __future__ import annotations

import argparse
import collections
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", action="store_true", help="tensor parallel instead of FSDP2")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--clip", action="store_true")
    p.add_argument("--count", default="")
    p.add_argument("--twice", default="", metavar="RUN_DIR")
    p.add_argument("--meta-init", action="store_true", help="pytorch/examples' FSDP2 bug")
    p.add_argument("--no-zero-grad", action="store_true", help="never clear the gradients")
    p.add_argument("--log-act", action="store_true", help="log(relu(x)) between the layers")
    return p.parse_args()


class Net(nn.Module):
    def __init__(self, log_act: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.down = nn.Linear(32, 4)
        self.log_act = log_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.log_act:
            return self.down(torch.log(self.act(self.up(x))))
        return self.down(self.act(self.up(x)))


def build(tp: bool, world: int, log_act: bool = False) -> nn.Module:
    model = Net(log_act)
    if tp:
        mesh = init_device_mesh("cpu", (world,))
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return build_sharded(model, world)


def build_sharded(model: nn.Module, world: int) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model.up, mesh=mesh)
    fully_shard(model.down, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def build_on_meta(world: int) -> nn.Module:
    """pytorch/examples' FSDP2 example's way (distributed/FSDP2/example.py): built on the meta
    device, sharded, given memory by to_empty(), then only the root's own modules initialised:
    the others keep what the memory held (here made NaN, so that every run is the same)."""
    with torch.device("meta"):
        model = Net()
    model = build_sharded(model, world)
    model.to_empty(device="cpu")
    model.down.reset_parameters()  # the example's root-level reset_parameters(): not `up`
    with torch.no_grad():
        for p in model.up.parameters():
            p.to_local().fill_(float("nan"))
    return model


def train(args: argparse.Namespace, rank: int, world: int, census: bool = False) -> None:
    torch.manual_seed(0)
    model = build_on_meta(world) if args.meta_init else build(args.tp, world, args.log_act)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1 if args.tp else rank + 1)
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if args.clip:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if census and step == args.steps - 1:
            write_census(rank)
        if not args.no_zero_grad:
            optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)


def write_census(rank: int) -> None:
    import json

    from torchdoctor import session
    from torchdoctor._json import dumps
    from torchdoctor.memory.view import census
    from torchdoctor.report.memory import render_census

    current = session.current()
    assert current is not None

    def execute(sql: str) -> tuple[list[str], list[object]]:
        result = current.sql.execute(sql)
        return result.columns, result.rows

    counted = census(execute)
    data = json.loads(dumps(counted))  # its JSON form, as `torchdoctor memory` writes it
    data["text"] = "\n".join(render_census(counted))
    # the works the probe still holds for polling (a work gloo never completes must not be
    # kept, its tensors with it, step after step)
    from torchdoctor.telemetry import collectives

    data["held_works"] = collectives._current[0].held_works()
    with open(f"census.rank{rank}.json", "w") as f:
        json.dump(data, f)


def counted(
    args: argparse.Namespace, rank: int, world: int, out: str, census: bool = False
) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(args, rank, world, census)
    counts: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        name = event.name
        if name.startswith(("c10d::", "_c10d_functional::", "c10d_functional::")):
            counts[name] += 1
    with open(f"{out}.rank{rank}", "w") as f:
        for name, n in sorted(counts.items()):
            f.write(f"{name} {n}\n")


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.twice:
        counted(args, rank, world, "plain")
        gc.collect()  # the first pass's model and optimizer: gone before the census counts
        import torchdoctor

        torchdoctor.start(run_dir=args.twice)
        counted(args, rank, world, "probed", census=True)
    elif args.count:
        counted(args, rank, world, args.count)
    else:
        train(args, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
