"""The tiny CPU step's instructions, counted by callgrind: plain, under torchdoctor, under
torchdoctor with the silent-error checks off (`steady`: the ordinary step alone, no sampled
step in the window), and under the least Python that records the same per-step facts at the
same places (the floor).

Machine-independent where timings are not (docs/benchmarks.md, "The steady step"):

    valgrind --tool=callgrind --toggle-collect=functools_reduce \\
        .venv/bin/python benchmarks/step_instructions.py {plain,torchdoctor,steady,floor} 200

counts only what runs inside the loop of N steps (after 30 of warm-up), on the training thread
alone; divide "Collected" by N and subtract plain's. Run without valgrind it just trains.
`step_instructions.py time [ROUNDS]` times plain, the floor and torchdoctor side by side in one
process instead (what the floor costs tells how near a budget can be met by trimming Python).

The floor is a measuring stick, not a recorder: a forward pre-hook and forward hook on the
model, a `torch.autograd.backward` wrapper and the global optimizer hooks, as torchdoctor
installs them, each with its guard (Dynamo, the switch, the training thread), doing the least
that gives a python.steps row: the phases (the compiled PhaseTimer), the loss, the gradient
norm (the compiled grad_squares), the loss's line, the row.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from _models import tiny_parts

PHASES = ("data_wait", "forward", "backward", "optimizer", "evaluation")


def floor_recorder(model: torch.nn.Module) -> tuple[list[tuple[Any, ...]], Callable[[], None]]:
    """Hook the least recorder on `model` and every optimizer; its rows, and what unhooks it."""
    from torchdoctor import native
    from torchdoctor.frames import caller_frame

    kernels = native.load()
    if kernels is None:
        raise SystemExit("the floor needs the compiled module: python -m torchdoctor.native")
    compiling = torch.compiler.is_dynamo_compiling
    now, ident, train = time.perf_counter, threading.get_ident, threading.get_ident()
    timer, rows = kernels.PhaseTimer(), []
    on = [True]

    class State:
        __slots__ = ("losses", "micro", "norm", "phases", "start", "tape")

        def __init__(self, start: float | None) -> None:
            self.start, self.phases = start, dict.fromkeys(PHASES, 0.0)
            self.losses: list[float] = []
            self.tape: list[Any] = []
            self.micro, self.norm = 0, 0.0

    current = [State(None)]

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        if compiling() or not on[0] or ident() != train:
            return
        t, state = now(), current[0]
        if len(state.tape) < 8:
            state.tape.append((module, args, kwargs))
        segment = "forward" if torch.is_grad_enabled() else "evaluation"
        if timer.begin_forward(t, state.phases, segment) and state.start is None:
            state.start = t

    def post(module: Any, args: Any, output: Any) -> None:
        if compiling() or not on[0] or ident() != train:
            return
        timer.end_forward(now(), current[0].phases)

    original = torch.autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling() or not on[0] or ident() != train:
            return original(tensors, *args, **kwargs)
        state = current[0]
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            caller_frame(sys._getframe(1))
            state.losses.append(tensors.item())
        timer.enter("backward", now(), state.phases)
        try:
            return original(tensors, *args, **kwargs)
        finally:
            timer.exit("backward", now(), state.phases)
            state.micro += 1

    def optimizer_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiling() or not on[0]:
            return
        state = current[0]
        timer.enter("optimizer", now(), state.phases)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        squares, _with_grad = kernels.grad_squares(params, 1 << 18)
        state.norm = math.sqrt(squares)

    def optimizer_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiling() or not on[0]:
            return
        t, state = now(), current[0]
        timer.exit("optimizer", t, state.phases)
        timer.step_ended(t, state.phases)
        current[0] = State(now())
        phases, losses = state.phases, state.losses
        duration = t - (state.start or t)
        # python.steps' columns in its order (store/schema.py); memory and rank at 0
        columns = [phases[name] for name in PHASES[:4]]
        other = max(0.0, duration - sum(phases.values()))
        loss = sum(losses) / len(losses) if losses else None
        lr = optimizer.param_groups[0]["lr"]
        tail = (0, 0, 0, 0, 0, state.micro, False, False, phases["evaluation"])
        rows.append(
            (len(rows), time.time(), duration, *columns, other, loss, state.norm, lr, *tail)
        )

    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    handles = [
        model.register_forward_pre_hook(pre, with_kwargs=True),
        model.register_forward_hook(post, always_call=True),
        register_optimizer_step_pre_hook(optimizer_pre),
        register_optimizer_step_post_hook(optimizer_post),
    ]
    torch.autograd.backward = backward

    def remove() -> None:
        for handle in handles:
            handle.remove()
        torch.autograd.backward = original

    return rows, remove


def timed(step: Callable[[], object], model: torch.nn.Module, blocks: int) -> None:
    """The three side by side in one process (`time` mode): the median step of each block of
    300, in the training thread's CPU time, and each one's extra over plain."""
    from _interleave import interleave, plain
    from _probe import bench_probe, recording

    probe = bench_probe(trace_every=0)

    @contextlib.contextmanager
    def floor() -> Iterator[None]:
        _rows, remove = floor_recorder(model)
        try:
            yield
        finally:
            remove()

    configs = {
        "plain": plain,
        "floor": floor,
        "torchdoctor": lambda: recording(probe, trace_every=0),
    }
    t = interleave(step, configs, blocks, 300, clock=time.thread_time)
    probe.stop()
    base = t["plain"]
    print(f"tiny CPU step, median of blocks of 300, training thread's CPU time ({blocks} rounds)")
    print(f"  plain        {base * 1e6:7.1f} us")
    for name in ("floor", "torchdoctor"):
        extra = (t[name] - base) * 1e6
        print(f"  {name:<12} {t[name] * 1e6:7.1f} us  +{extra:5.1f} us  ratio {t[name] / base:.3f}")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    torch.set_num_threads(1)
    step, model = tiny_parts()
    if mode == "time":
        timed(step, model, int(sys.argv[2]) if len(sys.argv) > 2 else 16)
        return
    done: Any = None
    if mode in ("torchdoctor", "steady"):
        from _probe import bench_probe, recording

        probe = bench_probe(trace_every=0)
        context = recording(probe, trace_every=0)
        context.__enter__()
        if mode == "steady":  # no sampled step in the window: the ordinary step alone
            probe.telemetry.silent.switch.on = False
        done = lambda: (context.__exit__(None, None, None), probe.stop())  # noqa: E731
    elif mode == "floor":
        floor_recorder(model)
    elif mode != "plain":
        raise SystemExit(f"mode: plain, torchdoctor, steady or floor, not {mode!r}")
    for _ in range(30):
        step()
    functools.reduce(lambda _a, _b: step(), range(steps), 0.0)  # callgrind's toggle: N steps
    if done is not None:
        done()


if __name__ == "__main__":
    main()
