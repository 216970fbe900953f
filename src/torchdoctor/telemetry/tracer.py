"""Module tracing on sampled steps: one python.torch_trace row per module call and stage.

Forward: global forward pre/post hooks time every module call (inclusive of its children).
Backward: a pre-hook on the autograd node that made each module's output fires when that
module's output gradient arrives; the time until the next such event is the module's own
(exclusive) backward time, and a module's backward duration is the sum over its subtree. No
backward hooks on modules: those wrap outputs and break in-place ops that follow them.
"""

from __future__ import annotations

import math
from typing import Any

from torchdoctor.telemetry import gradients
from torchdoctor.telemetry.clock import CpuClock


class Tracer:
    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        self.clock: Any = CpuClock()
        self.step = -1
        self._stack: list[tuple[Any, str, Any, float]] = []  # (module, name, start mark, wall)
        self._forward: list[tuple[Any, ...]] = []
        self._nodes: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._bwd_events: list[tuple[Any, tuple[str, ...], tuple[str, ...], float, int]] = []

    @property
    def depth(self) -> int:
        return len(self._stack)

    def begin(self, step: int, clock: Any) -> None:
        self.step = step
        self.clock = clock
        self._stack.clear()
        self._forward.clear()
        self._nodes.clear()
        self._bwd_events.clear()

    # -- forward ---------------------------------------------------------------------------
    def enter(self, module: Any, name: str, wall: float) -> None:
        self._stack.append((module, name, self.clock.mark(), wall))

    def exit(self, module: Any, output: Any) -> None:
        if not self._stack or self._stack[-1][0] is not module:
            return  # a call that started before tracing began
        _mod, name, start, wall = self._stack.pop()
        end = self.clock.mark()
        alloc, peak = self.rec.memory.allocated()
        chain = (*tuple(n for _m, n, _s, _w in self._stack), name)
        types = (*tuple(type(m).__name__ for m, _n, _s, _w in self._stack), type(module).__name__)
        self._forward.append((start, end, chain, types, wall, alloc, peak))
        node = _grad_fn(output)
        if node is not None and id(node) not in self._nodes:
            node_id, step = id(node), self.step
            self._nodes[node_id] = (chain, types)
            node.register_prehook(lambda _grads: self._on_grad(node_id, step))

    # -- per-module gradients ----------------------------------------------------------------
    def module_grads(self, optimizer: Any, models: Any, readback: Any, rank: int) -> None:
        """python.module_grads: each module's gradient and weight norms on a traced step, read
        back without a sync."""
        by_module: dict[str, list[Any]] = {}
        # parameters of modules never called as modules (their .forward() called directly, a
        # layer kept in a plain list): named by the optimizer that updates them
        unnamed = f"parameters of {self.rec.optimizers.label(optimizer)} (no module call seen)"
        for group in optimizer.param_groups:
            for p in group["params"]:
                named = models.param_name(p)
                by_module.setdefault(named[0] if named else unnamed, []).append(p)
        names = list(by_module)
        with_grad = [[p for p in by_module[n] if p.grad is not None] for n in names]
        flat_grads = [p.grad for ps in with_grad for p in ps]
        flat_params = [p for n in names for p in by_module[n]]
        values = gradients.norm_tensor(self.rec.torch, flat_grads + flat_params)
        if values is None:
            return
        step, table = self.step, self.rec.tables["module_grads"]

        def done(norms: list[float]) -> None:
            gnorms, pnorms = iter(norms[: len(flat_grads)]), iter(norms[len(flat_grads) :])
            rows = []
            for name, gs in zip(names, with_grad, strict=True):
                ps = by_module[name]
                g2 = sum(next(gnorms) ** 2 for _ in gs)
                p2 = sum(next(pnorms) ** 2 for _ in ps)
                trainable = sum(1 for p in ps if p.requires_grad)
                grad_norm = math.sqrt(g2) if gs else None
                rows.append((step, name, grad_norm, math.sqrt(p2), len(gs), trainable, rank))
            table.extend(rows)

        readback.submit(values, done)

    # -- backward --------------------------------------------------------------------------
    def _on_grad(self, node_id: int, step: int) -> None:
        if step != self.step or not self.rec.switch.on:
            return  # a retained graph replayed on a later step
        entry = self._nodes.get(node_id)
        if entry is not None:
            alloc, _peak = self.rec.memory.allocated()
            self._bwd_events.append((self.clock.mark(), entry[0], entry[1], _wall(), alloc))

    def last_backward(self) -> str | None:
        """The module whose backward started last in the step being traced."""
        events = self._bwd_events
        return str(events[-1][1][-1]) if events else None

    def end(self, backward_end: Any) -> None:
        """Close the traced step: rows now (CPU) or once the device has caught up (CUDA)."""
        job = (list(self._forward), list(self._bwd_events), backward_end, self.step)
        self._forward.clear()
        self._bwd_events.clear()
        self._nodes.clear()
        self._stack.clear()
        table = self.rec.tables["torch_trace"]
        if self.clock.cuda:  # its events are read once a copy queued after them has landed:
            self.rec.readback.after(lambda: table.extend(self._rows(*job)))  # never queried
        else:
            table.extend(self._rows(*job))

    def _rows(
        self, forward: list[Any], events: list[Any], backward_end: Any, step: int
    ) -> list[tuple[Any, ...]]:
        rank = self.rec.rank
        _alloc, peak = self.rec.memory.allocated()
        rows = []
        for start, end, chain, types, wall, alloc, peak_f in forward:
            duration = self.clock.elapsed(start, end)
            rows.append(
                (
                    step,
                    chain[-1],
                    types[-1],
                    "forward",
                    duration,
                    alloc,
                    peak_f,
                    wall,
                    len(chain) - 1,
                    rank,
                )
            )
        # Exclusive time of each event runs to the next event (or the end of backward);
        # a module's backward time is the sum over the events of its subtree.
        totals: dict[tuple[str, ...], list[Any]] = {}
        for i, (mark, chain, types, wall, alloc) in enumerate(events):
            nxt = events[i + 1][0] if i + 1 < len(events) else backward_end
            if nxt is None:
                continue
            exclusive = max(0.0, self.clock.elapsed(mark, nxt))
            next_alloc = events[i + 1][4] if i + 1 < len(events) else alloc
            for depth in range(len(chain)):
                key = chain[: depth + 1]
                entry = totals.get(key)
                if entry is None:
                    totals[key] = [exclusive, types[depth], wall, next_alloc]
                else:
                    entry[0] += exclusive
                    entry[3] = next_alloc
        for key, (duration, type_name, wall, alloc) in totals.items():
            rows.append(
                (
                    step,
                    key[-1],
                    type_name,
                    "backward",
                    duration,
                    alloc,
                    peak,
                    wall,
                    len(key) - 1,
                    rank,
                )
            )
        return rows


def _grad_fn(output: Any) -> Any:
    if hasattr(output, "grad_fn"):
        return output.grad_fn
    if isinstance(output, (tuple, list)):
        for item in output:
            node = getattr(item, "grad_fn", None)
            if node is not None:
                return node
    if isinstance(output, dict):
        for item in output.values():
            node = getattr(item, "grad_fn", None)
            if node is not None:
                return node
    return None


def _wall() -> float:
    import time

    return time.time()
