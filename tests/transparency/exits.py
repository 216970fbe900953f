"""Ways a training script ends early: sys.exit with a code, sys.exit with a message,
os._exit, an uncaught exception, a user's SIGTERM handler, and a SIGTERM left to its default;
and one that goes on: asyncio's signal handlers (its wakeup fd) for SIGUSR1 and SIGTERM."""

import os
import signal
import sys

import torch
from common import seed, show
from torch import nn


def train(steps: int) -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.randn(4, 3)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())


def main(how: str) -> None:
    seed()
    if how == "handler":

        def on_term(signum: int, frame: object) -> None:
            print("caught", signal.Signals(signum).name, flush=True)
            sys.exit(7)

        signal.signal(signal.SIGTERM, on_term)
    train(4)
    with open("partial.txt", "w") as f:
        f.write("written before the end\n")
    if how == "exit":
        sys.exit(3)
    if how == "message":
        sys.exit("stopping: not enough data")
    if how == "os_exit":
        sys.stdout.flush()
        os._exit(4)
    if how == "raise":
        raise RuntimeError("planted failure after 4 steps")
    if how in ("handler", "sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    if how == "asyncio":
        import asyncio

        asyncio.run(signals_through_asyncio())
    print("finished")


async def signals_through_asyncio() -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        seen = loop.create_future()
        loop.add_signal_handler(signum, seen.set_result, signal.Signals(signum).name)
        os.kill(os.getpid(), signum)
        print("asyncio handled", await asyncio.wait_for(seen, 60), flush=True)
        loop.remove_signal_handler(signum)
    print("wakeup fd after asyncio:", signal.set_wakeup_fd(-1), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
