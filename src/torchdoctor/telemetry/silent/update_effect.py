"""An optimizer.step() that leaves the weights unchanged although they have gradients and a
learning rate that should move them (an update written to a copy, a step that skips every
parameter, an optimizer holding tensors the model no longer uses).

On a sampled step a slice of a few parameters with gradients is kept before the update and
compared after it, element by element, where the update is large enough to be seen at the
weights' precision: lr * |grad| for SGD-like optimizers, lr for adaptive ones (Adam's first
steps move each weight by about lr), against 4 units in the last place of the weight. A finding
needs every such element unchanged on two sampled steps. Compared on the device; the two
counts are read back through the Readback.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.local_shards import local

SLICE = 4096
PROBES = 4
CONFIRM = 2  # sampled steps with no visible change before it is said


class UpdateEffects:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.pending: dict[int, tuple[Any, ...]] = {}
        self.unchanged: dict[int, int] = {}  # id(optimizer) -> sampled steps seen unchanged
        self.done: set[int] = set()

    def before_update(self, optimizer: Any, step: int) -> None:
        if id(optimizer) in self.done:
            return
        torch = self.host.torch
        probes = []
        for group in optimizer.param_groups:
            lr = group.get("lr")
            if isinstance(lr, torch.Tensor):
                lr = float(lr) if lr.device.type == "cpu" else None
            if not isinstance(lr, (int, float)) or lr <= 0:
                continue
            adaptive = "betas" in group or "beta2_decay" in group
            for p in group["params"]:
                g = p.grad
                if g is None or g.layout != torch.strided or not p.dtype.is_floating_point:
                    continue
                w = _slice(p)
                probes.append((p, w.clone(), _slice(g).clone(), float(lr), adaptive))
                if len(probes) == PROBES:
                    break
            if len(probes) == PROBES:
                break
        if probes:
            self.pending[id(optimizer)] = (step, probes, self.host.user_site())

    def after_update(self, optimizer: Any, step: int) -> None:
        pending = self.pending.pop(id(optimizer), None)
        if pending is None or pending[0] != step:
            return
        torch = self.host.torch
        _step, probes, site = pending
        visible = bad = None
        for p, w0, g, lr, adaptive in probes:
            eps = torch.finfo(w0.dtype)
            w1 = _slice(p)
            if w1.shape != w0.shape:
                return
            expected = torch.full_like(g, lr) if adaptive else g.abs() * lr
            seen = (g != 0) & (expected > 4 * eps.eps * w0.abs() + eps.tiny)
            same = seen & (w1 == w0)
            v, b = seen.sum(), same.sum()
            visible = v if visible is None else visible + v
            bad = b if bad is None else bad + b
        if visible is None or bad is None:
            return
        key = id(optimizer)
        label = self.host.label(optimizer)
        lrs = sorted({probe[3] for probe in probes})
        kind = type(optimizer).__name__

        def done(values: list[float]) -> None:
            seen, unchanged = values
            if seen == 0 or key in self.done:
                return
            if unchanged < seen:
                self.unchanged.pop(key, None)
                return
            count = self.unchanged.get(key, 0) + 1
            self.unchanged[key] = count
            if count >= CONFIRM:
                self.done.add(key)
                data = {"optimizer": label, "step": step, "site": site, "elements": int(seen)}
                data["lr"] = lrs[0] if len(lrs) == 1 else lrs
                data["optimizer_type"] = kind
                self.host.emit("ineffective_update", data, key=label)

        self.host.rec.readback.submit(torch.stack([visible, bad]).float(), done)


def _slice(t: Any) -> Any:
    return local(t).detach().reshape(-1)[:SLICE]
