"""An optimizer.step() that leaves the weights unchanged although they have gradients and a
learning rate that should move them (an update written to a copy, a step that skips every
parameter, an optimizer holding tensors the model no longer uses); and one that stepped with no
gradient on any of its trainable parameters (a generator whose loss was computed on a detached
output: backward() never reaches it), read after step() so that a closure's backward counts.

On a sampled step a slice of a few parameters with gradients is kept before the update and
compared after it, element by element, where the update is large enough to be seen at the
weights' precision: lr * |grad| for SGD-like optimizers, lr for adaptive ones (Adam's first
steps move each weight by about lr), against 4 units in the last place of the weight. A finding
needs every such element unchanged on two sampled steps. Compared on the device, the slices
end to end (a few ops whatever the number of probes); the two counts are read back through the
Readback.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.local_shards import local

SLICE = 1024
PROBES = 4
CONFIRM = 2  # sampled steps with no visible change before it is said


class UpdateEffects:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.pending: dict[int, tuple[Any, ...]] = {}
        self.unchanged: dict[int, int] = {}  # id(optimizer) -> sampled steps seen unchanged
        self.done: set[int] = set()
        self.gradless: dict[int, int] = {}  # id(optimizer) -> sampled steps without a gradient
        # id(optimizer) -> (hook handles, [whether a gradient came in]): armed on a few of
        # its parameters once it stepped with none, to tell "backward() never reached them"
        # from "their gradients were cleared between backward() and step()"
        self.arrivals: dict[int, tuple[list[Any], list[bool]]] = {}

    def before_update(self, optimizer: Any, step: int) -> None:
        if id(optimizer) in self.done:
            return
        torch = self.host.torch
        params, rates, adaptive = [], [], False
        dtype = device = None
        for group in optimizer.param_groups:
            lr = group.get("lr")
            if isinstance(lr, torch.Tensor):
                lr = float(lr) if lr.device.type == "cpu" else None
            if not isinstance(lr, (int, float)) or lr <= 0:
                continue
            for p in group["params"]:
                g = p.grad
                if g is None or g.layout != torch.strided or not p.dtype.is_floating_point:
                    continue
                if dtype is None:
                    dtype, device = p.dtype, p.device
                elif p.dtype != dtype or p.device != device:
                    continue  # one dtype and device: one vector
                params.append(p)
                rates.append(float(lr))
                adaptive = adaptive or "betas" in group or "beta2_decay" in group
                if len(params) == PROBES:
                    break
            if len(params) == PROBES:
                break
        if not params:
            return
        weights = _slices(torch, params).clone()
        grads = _slices(torch, [p.grad for p in params])
        if len(set(rates)) == 1:
            per_element: Any = rates[0]
        else:  # groups of different rates: one per element
            sizes = torch.tensor([min(SLICE, p.numel()) for p in params])
            per_element = torch.repeat_interleave(torch.tensor(rates, dtype=weights.dtype), sizes)
            per_element = per_element.to(weights.device)
        site = self.host.user_site()
        pending = (step, params, weights, grads, per_element, rates, adaptive, site)
        self.pending[id(optimizer)] = pending

    def after_update(self, optimizer: Any, step: int) -> None:
        self._gradients(optimizer, step)
        pending = self.pending.pop(id(optimizer), None)
        if pending is None or pending[0] != step:
            return
        torch = self.host.torch
        _step, params, w0, g, lr, rates, adaptive, site = pending
        w1 = _slices(torch, params)
        if w1.shape != w0.shape:
            return
        eps = torch.finfo(w0.dtype)
        numeric = w0.device.type == "cpu" and w0.dtype in (torch.float32, torch.float64)
        if numeric:  # numpy's small-array arithmetic costs less on CPU
            w0, w1, g = w0.numpy(), w1.numpy(), g.numpy()
            lr = lr.numpy() if isinstance(lr, torch.Tensor) else lr
        visible = 4 * eps.eps * abs(w0) + eps.tiny  # what a change must exceed to be seen
        seen = (g != 0) & ((lr > visible) if adaptive else (abs(g) * lr > visible))
        counts = [seen.sum(), (seen & (w1 == w0)).sum()]
        key = id(optimizer)
        label = self.host.label(optimizer)
        lrs = sorted(set(rates))
        kind = type(optimizer).__name__

        def done(values: list[float]) -> None:
            visible, unchanged = values
            if visible == 0 or key in self.done:
                return
            if unchanged < visible:
                self.unchanged.pop(key, None)
                return
            count = self.unchanged.get(key, 0) + 1
            self.unchanged[key] = count
            if count >= CONFIRM:
                self.done.add(key)
                data = {"optimizer": label, "step": step, "site": site, "elements": int(visible)}
                data["lr"] = lrs[0] if len(lrs) == 1 else lrs
                data["optimizer_type"] = kind
                self.host.emit("ineffective_update", data, key=label)

        if numeric:
            done([float(c) for c in counts])
        else:
            self.host.rec.readback.submit(torch.stack(counts).float(), done)

    def _gradients(self, optimizer: Any, step: int) -> None:
        """No trainable parameter of `optimizer` has a gradient after its step(), on CONFIRM
        sampled steps in a row: the step changes nothing (weight decay aside). Whether a
        backward() brought them gradients in between (cleared before the step: the step
        runs before backward(), or zero_grad() after it) or none (never reached)."""
        key = id(optimizer)
        if self.gradless.get(key, 0) >= CONFIRM:
            return
        trainable = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not trainable or any(p.grad is not None for p in trainable):
            if key in self.gradless:  # every step: nothing to undo unless it was gradless
                del self.gradless[key]
                self._disarm(key)
            return
        count = self.gradless[key] = self.gradless.get(key, 0) + 1
        arrived = self.arrivals[key][1][0] if key in self.arrivals else False
        self._disarm(key)
        if count < CONFIRM:
            self._arm(key, trainable)
            return
        ids = {id(p) for p in trainable}
        names = [  # the models that hold them
            label
            for model, label in self.host.rec.models.roots()
            if any(id(p) in ids for p in model.parameters())
        ]
        data = {
            "optimizer": self.host.label(optimizer),
            "step": step,
            "site": self.host.user_site(),
            "parameters": len(trainable),
            "modules": names,
            # backward() did bring them gradients since the last step(); gone at this one
            "cleared": arrived,
        }
        self.host.emit("no_gradient", data, key=data["optimizer"])

    def _arm(self, key: int, trainable: list[Any]) -> None:
        seen = [False]

        def came_in(_param: Any) -> None:
            seen[0] = True

        handles = [p.register_post_accumulate_grad_hook(came_in) for p in trainable[:PROBES]]
        self.arrivals[key] = (handles, seen)

    def _disarm(self, key: int) -> None:
        handles, _seen = self.arrivals.pop(key, ([], []))
        for handle in handles:
            handle.remove()

    def remove(self) -> None:
        for key in list(self.arrivals):
            self._disarm(key)


def _slices(torch: Any, tensors: list[Any]) -> Any:
    return torch.cat([local(t).detach().reshape(-1)[:SLICE] for t in tensors])
