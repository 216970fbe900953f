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
read back through the Readback (no host sync); on CPU it runs in numpy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from torchdoctor.telemetry.local_shards import PLAIN, local

SLICE = 512  # elements of each probe gradient compared
PROBES = 4
MATCH, MISS = 1e-3, 1e-2


@dataclasses.dataclass
class Probe:
    label: str
    step: int  # the update after which the probes were taken
    params: list[Any]
    before: Any  # B
    handles: list[Any]
    incoming: list[tuple[int, int, Any]] = dataclasses.field(default_factory=list)
    # (backward() call, probe index, its slice) for every gradient brought in since
    broken: bool = False
    # The probes' gradient slices as each backward() call began (None for a gradient that was
    # None, cleared). When clipping scales huge new gradients to a norm of 1, the old ones (B)
    # vanish in G = c(B + F) and both readings match; B untouched when the next backward()
    # begins, and never cleared before the update, tells them apart. Sharded parameters
    # (DTensor): FSDP2 never runs a tensor hook on them, it sets their .grad after its
    # reduce-scatter and then runs their post-accumulate hooks; what came in is then the
    # slice after less the slice this backward() began with.
    starts: list[list[Any]] = dataclasses.field(default_factory=list)
    hooked: set[int] = dataclasses.field(default_factory=set)  # indexes a tensor hook reached

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
        for probe in self.armed.values():
            probe.starts.append([None if p.grad is None else _slice(p.grad) for p in probe.params])

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
        before = _slices(torch, [p.grad for p in params])
        probe = Probe(self.host.label(optimizer), step, params, before, [])
        for i, p in enumerate(params):
            probe.handles.append(p.register_hook(functools.partial(self._incoming, probe, i)))
            if p.__class__ not in PLAIN:  # sharded: see Probe.starts
                hook = functools.partial(self._accumulated, probe, i)
                probe.handles.append(p.register_post_accumulate_grad_hook(hook))
        old = self.armed.pop(id(optimizer), None)
        if old is not None:
            old.remove()
        self.armed[id(optimizer)] = probe

    def _incoming(self, probe: Probe, i: int, grad: Any) -> None:
        """A gradient backward() brings to probe parameter `i` (before it is accumulated):
        copied, since autograd may make this very tensor the parameter's .grad."""
        try:
            probe.incoming.append((self.backwards, i, _slice(grad)))
            probe.hooked.add(i)
        except Exception:  # never break the user's backward(): this probe decides nothing
            probe.broken = True

    def _accumulated(self, probe: Probe, i: int, param: Any) -> None:
        """A sharded parameter's .grad was set (FSDP2, after its reduce-scatter): when no
        tensor hook saw the gradient come in, it is the difference the backward() made."""
        if i in probe.hooked:
            return
        try:
            after = _slice(param.grad)
            before = probe.starts[-1][i] if probe.starts else None
            probe.incoming.append((self.backwards, i, after if before is None else after - before))
        except Exception:  # never break the user's backward(): this probe decides nothing
            probe.broken = True

    def before_update(self, optimizer: Any, step: int, primary: bool) -> None:
        probe = self.armed.pop(id(optimizer), None)
        if probe is None:
            return
        probe.remove()
        if probe.step != step - 1 or probe.broken:
            return
        grads = [p.grad for p in probe.params]
        if any(g is None for g in grads) or not probe.incoming:
            return  # set to None since (cleared), or nothing came in
        torch = self.host.torch
        now = _slices(torch, grads)
        if now.shape != probe.before.shape:
            return
        on_cpu = now.device.type == "cpu"  # numpy's small-array arithmetic costs less there
        xp: Any = np if on_cpu else torch
        g, before = (now.numpy(), probe.before.numpy()) if on_cpu else (now, probe.before)
        sizes = [min(SLICE, local(p).numel()) for p in probe.params]  # a DTensor: its shard
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        total, last = xp.zeros_like(g), xp.zeros_like(g)
        final = probe.incoming[-1][0]
        for call, i, part in probe.incoming:
            if part.shape[0] != sizes[i]:
                return  # a gradient sharded otherwise than its parameter: nothing to compare
            part = part.numpy() if on_cpu else part
            total[starts[i] : starts[i] + sizes[i]] += part
            if call == final:
                last[starts[i] : starts[i] + sizes[i]] += part
        values = _readings(xp, g, before, total, last, _untouched(xp, probe, on_cpu))
        rec = self.host.rec
        micro = int(rec.state.micro) if primary else 0
        site = self.host.user_site()
        fetches = self.host.fetches
        key = id(optimizer)

        def done(v: list[float]) -> None:
            self._judge(key, probe, step, site, micro, fetches, v)

        if on_cpu:
            done([float(x) for x in values])
        else:
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
        kept, cleared, last, factor, share, _incoming, untouched = v
        if not all(math.isfinite(x) for x in v) or key in self.done:
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
        if untouched:
            data["untouched"] = True  # the readings alone did not tell (clipping)
        if kept < MATCH and (cleared > MISS or untouched) and factor > 0:
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


def _slices(torch: Any, tensors: list[Any]) -> Any:
    """The first SLICE elements of each tensor, end to end, in float64."""
    return torch.cat([local(t).detach().reshape(-1)[:SLICE] for t in tensors]).double()


def _slice(tensor: Any) -> Any:
    """The first SLICE elements of this rank's part of `tensor`, copied, in float64."""
    part = local(tensor).detach().reshape(-1)[:SLICE]
    copy = part.double()
    return copy.clone() if copy is part else copy  # float64 already: .double() is itself


def _untouched(xp: Any, probe: Probe, on_cpu: bool) -> Any:
    """1 when the first backward() since the update began with the gradients the update
    applied, bit for bit, and no later one began with them cleared (None or all zero); else
    0 (a scalar of `xp`, read back with the rest)."""
    # zeros where the readings are: a CPU scalar would not stack with a GPU's
    zero = xp.zeros(()) if on_cpu else probe.before.new_zeros(())
    if not probe.starts or any(s is None for parts in probe.starts for s in parts):
        return zero
    joined = (
        [xp.concatenate([s.numpy() for s in parts]) for parts in probe.starts]
        if on_cpu
        else [xp.cat(parts) for parts in probe.starts]
    )
    before = probe.before.numpy() if on_cpu else probe.before
    if joined[0].shape != before.shape:
        return zero
    same = (joined[0] == before).all()
    for s in joined[1:]:
        same = same & s.any()
    return same * 1.0


def _readings(xp: Any, g: Any, before: Any, total: Any, last: Any, untouched: Any) -> Any:
    """[residual kept, residual cleared, residual last, factor kept, |B|/|G|, |F|, untouched]
    (numpy arrays or torch tensors alike): each residual |g - c b| / |g| at the best c, from
    dot products, in a handful of operations whatever the number of probes."""
    rows = xp.stack([before + total, total, last, before])
    dots = rows @ g
    norms2 = (rows * rows).sum(1).clip(min=1e-300)
    g2 = (g * g).sum().clip(min=1e-300)
    residual = ((g2 - dots * dots / norms2).clip(min=0) / g2) ** 0.5
    factor = dots[0] / norms2[0]
    share = (norms2[3] / g2) ** 0.5
    return xp.stack(
        [residual[0], residual[1], residual[2], factor, share, norms2[1] ** 0.5, untouched + 0.0]
    )
