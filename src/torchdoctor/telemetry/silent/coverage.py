"""The model's parameters against the optimizers', at the primary optimizer's update on sampled
steps (from step 2, when every optimizer of a GAN has stepped at least once):

- unoptimized: parameters that require grad and have a gradient, but that no optimizer holds
  (an optimizer built before a layer was replaced, or over a copy of the model): their
  gradients are computed every step and never applied. Said once seen on two sampled steps.
- frozen: (once) a model whose only trainable parameters are those of its normalization
  layers and biases, every weight matrix and kernel frozen, the output layer included: a
  `requires_grad = False` loop that froze more than it meant to. Frozen backbones under a
  trainable head are not this.
- the optimizers: their names, classes and each parameter group's learning rate (python.steps
  holds the primary's first group only), again whenever which groups are at 0 changes.
"""

from __future__ import annotations

from typing import Any

CONFIRM = 2
_NORMS = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm", "LocalResponseNorm")


class Coverage:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.missing: dict[str, int] = {}  # model -> sampled steps seen with such parameters
        self.frozen_checked = False
        self.zeros: list[list[bool]] = []  # per optimizer: which groups' lr is 0

    def before_update(self, step: int) -> None:
        if not self.frozen_checked:
            self.frozen_checked = True
            self._frozen()
        self._learning_rates()
        if step >= 2:
            self._unoptimized(step)

    def _unoptimized(self, step: int) -> None:
        ids = self.host.param_ids()
        for root, label in self.host.rec.models.models():
            names, elements = [], 0
            for name, p in root.named_parameters():
                if p.requires_grad and p.grad is not None and id(p) not in ids:
                    names.append(name)
                    elements += p.numel()
            if not names:
                self.missing.pop(label, None)
                continue
            count = self.missing.get(label, 0) + 1
            self.missing[label] = count
            if count < CONFIRM:
                continue
            total = sum(1 for p in root.parameters() if p.requires_grad)
            data = {
                "model": label,
                "step": step,
                "parameters": names[:8],
                "count": len(names),
                "elements": elements,
                "trainable": total,
                "modules": sorted({n.rpartition(".")[0] or label for n in names})[:8],
                "site": self.host.user_site(),
            }
            self.host.emit("unoptimized_parameters", data, key=label)

    def _frozen(self) -> None:
        ids = self.host.param_ids()
        for root, label in self.host.rec.models.models():
            owners = {}
            for mod_name, module in root.named_modules():
                for p_name, p in module.named_parameters(recurse=False):
                    owners[id(p)] = (mod_name, p_name, type(module).__name__, p)
            if not any(i in ids for i in owners):
                continue
            trainable = [o for o in owners.values() if o[3].requires_grad]
            matrices = [o for o in owners.values() if o[3].dim() >= 2]
            if not trainable or not matrices:
                continue
            if any(o[3].dim() >= 2 for o in trainable):
                continue  # some weight matrix or kernel trains: a partial freeze on purpose
            if not all(_is_norm(o[2]) or o[1] == "bias" for o in trainable):
                continue
            last = matrices[-1]
            data = {
                "model": label,
                "trainable": sum(o[3].numel() for o in trainable),
                "total": sum(o[3].numel() for o in owners.values()),
                "trainable_modules": sorted({o[2] for o in trainable}),
                "output_layer": last[0] or label,
                "output_frozen": not last[3].requires_grad,
                "step": self.host.rec.step,
            }
            self.host.emit("frozen_model", data, key=label)

    def _learning_rates(self) -> None:
        """The optimizers, their classes and learning rates (where python.steps has the
        primary's first group only): once, then whenever which groups are at 0 changes."""
        rec = self.host.rec
        primary = rec.optimizers.primary
        rows: list[dict[str, Any]] = []
        for optimizer in rec.optimizers.known():
            lrs = [_number(g.get("lr")) for g in optimizer.param_groups]
            rows.append(
                {
                    "optimizer": self.host.label(optimizer),
                    "type": type(optimizer).__name__,
                    "primary": optimizer is primary,
                    "lrs": lrs,
                }
            )
        zeros = [[lr == 0 for lr in row["lrs"]] for row in rows]
        if zeros != self.zeros:
            self.zeros = zeros
            self.host.emit("optimizers", {"optimizers": rows})


def _is_norm(cls: str) -> bool:
    return any(n in cls for n in _NORMS)


def _number(lr: Any) -> float | None:
    if isinstance(lr, (int, float)):
        return float(lr)
    device = getattr(lr, "device", None)
    return float(lr) if device is not None and device.type == "cpu" else None
