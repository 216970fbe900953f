"""Gradients never cleared between two updates, and gradients cleared at every micro-batch.

How it is told, for certain and apart from gradient accumulation: after an update on a sampled
step, a few small parameters of that optimizer become probes. Their gradients are kept (B, a
slice of each) and a hook on each probe parameter adds up every gradient backward() brings in
until the next update: in all (F), and from the last backward() call alone (L). At the next
update the probes' gradients (G) are compared, up to one common factor (gradient clipping and
GradScaler's unscaling scale them all alike):

  G = c * (B + F)   nothing cleared them: the previous step's gradients are still in,
                    and this update applies them again (optimizer.zero_grad() missing)
  G = c * F         cleared since the last update: right, with or without accumulation
  G = c * L         cleared before every backward(): only the last of several micro-batches
                    reaches the update (zero_grad() inside the accumulation loop)

A match is a relative residual under 1e-3 where the other reading misses by over 1e-2;
anything else (gradients cleared part-way, as a GAN's discriminator gets the generator's
backward in between) decides nothing. The arithmetic runs on the gradients' device and is
read back through the Readback (no host sync).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from torchdoctor.telemetry.local_shards import local

SLICE = 512  # elements of each probe gradient compared
PROBES = 4
MATCH, MISS = 1e-3, 1e-2


@dataclasses.dataclass
class Probe:
    label: str
    step: int  # the update after which the probes were taken
    params: list[Any]
    bounds: list[tuple[int, int]]  # each probe's elements in the vectors below
    before: Any  # B
    total: Any  # F
    last: Any  # L
    handles: list[Any]
    last_backward: int = -1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class GradientResets:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.armed: dict[int, Probe] = {}  # id(optimizer) -> its probes
        self.done: set[int] = set()  # optimizers found at fault: not looked at again
        self.backwards = 0  # backward() calls so far: which one a gradient came in with

    def on_backward(self) -> None:
        self.backwards += 1

    def after_update(self, optimizer: Any, step: int, next_sampled: bool) -> None:
        if not next_sampled or id(optimizer) in self.done:
            return
        torch = self.host.torch
        candidates = [
            p
            for group in optimizer.param_groups
            for p in group["params"]
            if p.requires_grad
            and p.grad is not None
            and p.grad.numel() >= 2
            and p.grad.layout == torch.strided
        ]
        if not candidates:
            return
        params = sorted(candidates, key=lambda p: p.numel())[:PROBES]
        slices = [_slice(p.grad) for p in params]
        bounds, start = [], 0
        for s in slices:
            bounds.append((start, start + s.numel()))
            start += s.numel()
        before = torch.cat(slices)
        probe = Probe(
            self.host.label(optimizer),
            step,
            params,
            bounds,
            before,
            torch.zeros_like(before),
            torch.zeros_like(before),
            [],
        )
        for i, p in enumerate(params):
            probe.handles.append(p.register_hook(functools.partial(self._incoming, probe, i)))
        old = self.armed.pop(id(optimizer), None)
        if old is not None:
            old.remove()
        self.armed[id(optimizer)] = probe

    def _incoming(self, probe: Probe, i: int, grad: Any) -> None:
        """A gradient backward() brings to probe parameter `i` (before it is accumulated)."""
        try:
            if probe.last_backward != self.backwards:
                probe.last.zero_()
                probe.last_backward = self.backwards
            a, b = probe.bounds[i]
            part = _slice(grad)
            probe.total[a:b] += part
            probe.last[a:b] += part
        except Exception:  # never break the user's backward(): this probe decides nothing
            probe.bounds = []

    def before_update(self, optimizer: Any, step: int, primary: bool) -> None:
        probe = self.armed.pop(id(optimizer), None)
        if probe is None:
            return
        probe.remove()
        if probe.step != step - 1 or not probe.bounds:
            return
        grads = [p.grad for p in probe.params]
        if any(g is None for g in grads):
            return  # set to None since: cleared
        torch = self.host.torch
        now = torch.cat([_slice(g) for g in grads])
        if now.shape != probe.before.shape:
            return
        values = torch.stack(
            [
                _residual(torch, now, probe.before + probe.total),
                _residual(torch, now, probe.total),
                _residual(torch, now, probe.last),
                _factor(torch, now, probe.before + probe.total),
                torch.linalg.vector_norm(probe.before) / _norm(torch, now),
                torch.linalg.vector_norm(probe.total),
            ]
        )
        rec = self.host.rec
        micro = int(rec.state.micro) if primary else 0
        site = self.host.user_site()
        fetches = self.host.fetches
        key = id(optimizer)

        def done(v: list[float]) -> None:
            self._judge(key, probe, step, site, micro, fetches, v)

        rec.readback.submit(values.float(), done)

    def _judge(
        self,
        key: int,
        probe: Probe,
        step: int,
        site: str | None,
        micro: int,
        fetches: int,
        v: list[float],
    ) -> None:
        kept, cleared, last, factor, share, incoming = v
        if not all(math.isfinite(x) for x in v) or incoming == 0 or key in self.done:
            return
        data = {
            "optimizer": probe.label,
            "step": step,
            "previous_step": probe.step,
            "site": site,
            "micro_batches": micro,
            "fetches": fetches,
            "residual_kept": kept,
            "residual_cleared": cleared,
            "residual_last": last,
            "previous_share": share,
        }
        if kept < MATCH and cleared > MISS and factor > 0:
            self.done.add(key)
            self.host.emit("grad_not_cleared", data, key=probe.label)
        elif micro >= 2 and last < MATCH and cleared > MISS:
            self.done.add(key)
            data["problem"] = "cleared_each_micro_batch"
            self.host.emit("accumulation", data, key=("cleared", probe.label))

    def remove(self) -> None:
        for probe in self.armed.values():
            probe.remove()
        self.armed.clear()


def _slice(t: Any) -> Any:
    return local(t).detach().reshape(-1)[:SLICE].double()


def _norm(torch: Any, a: Any) -> Any:
    return torch.linalg.vector_norm(a).clamp_min(1e-300)


def _factor(torch: Any, a: Any, b: Any) -> Any:
    """c minimising |a - c b|."""
    return (a * b).sum() / (b * b).sum().clamp_min(1e-300)


def _residual(torch: Any, a: Any, b: Any) -> Any:
    """|a - c b| / |a| at the best c: 0 when a is a multiple of b."""
    return torch.linalg.vector_norm(a - _factor(torch, a, b) * b) / _norm(torch, a)
