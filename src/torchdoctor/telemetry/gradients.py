"""Gradient norms: the total one every step (also the finiteness check), per module on traced
steps. On CUDA everything stays on the device; the values are read back later."""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.local_shards import PLAIN, local, local_all

_TENSOR = PLAIN[0]  # torch.Tensor: what a parameter's .grad is


def collect(optimizer: Any) -> tuple[list[Any], list[Any]]:
    """(params with a gradient, their gradients: this rank's shards of DTensor ones) over the
    optimizer's groups."""
    params = parameters(optimizer)
    grads = [p.grad for p in params]
    for g in grads:  # every parameter has a plain gradient: the common case, no new lists
        if g is None or g.__class__ is not _TENSOR:
            break
    else:
        return params, grads
    with_grad = [(p, g) for p, g in zip(params, grads, strict=True) if g is not None]
    return [p for p, _ in with_grad], [
        g if g.__class__ in PLAIN else local(g) for _, g in with_grad
    ]


# optimizer id -> (its param_groups list, the groups' params lists, all its parameters): the
# flat list is rebuilt only when a group is added or a group's list of params is replaced
_PARAMS: dict[int, tuple[Any, list[Any], list[Any]]] = {}


def parameters(optimizer: Any) -> list[Any]:
    """Every parameter the optimizer updates, in group order (looked up once per optimizer:
    this runs every step)."""
    groups = optimizer.param_groups
    cached = _PARAMS.get(id(optimizer))
    if cached is not None and cached[0] is groups and len(cached[1]) == len(groups):
        lists = cached[1]
        for i, group in enumerate(groups):
            if group["params"] is not lists[i]:
                break
        else:
            return cached[2]
    lists = [group["params"] for group in groups]
    flat = [p for params in lists for p in params]
    if len(_PARAMS) > 64:  # optimizers come and go (a notebook): keep the table small
        _PARAMS.clear()
    _PARAMS[id(optimizer)] = (groups, lists, flat)
    return flat


_FEW = 32
NATIVE_MAX = 1 << 18  # elements summed natively in one pass (sum_of_squares, grad_squares)
_SMALL = 1 << 20


def all_finite(torch: Any, grads: list[Any]) -> bool:
    return all(bool(torch.isfinite(g).all()) for g in grads)


class NormPlan:
    """How to take the total norm of one optimizer's gradients, decided once: per-step checks of
    every gradient's device and dtype would cost more than the norm of a small model."""

    def __init__(self) -> None:
        self._count = -1
        self._cat = False
        self._small = False

    def small(self, grads: list[Any]) -> bool:
        """Few enough elements for one native pass to beat torch's kernels (up to a few
        hundred thousand: past that, torch's vectorised, threaded norm wins)."""
        if len(grads) != self._count:
            self._decide(grads)
        return self._small

    def _decide(self, grads: list[Any]) -> None:
        self._count = len(grads)
        self._cat = _cat_fits(grads)
        self._small = sum(g.numel() for g in grads) <= NATIVE_MAX

    def __call__(self, torch: Any, grads: list[Any]) -> Any:
        if len(grads) != self._count:
            self._decide(grads)
        if self._cat:
            try:  # one C call flattens them all (no view() per gradient from Python)
                return torch.linalg.vector_norm(torch._C._nn.flatten_dense_tensors(grads))
            except (RuntimeError, TypeError, AttributeError):  # devices or dtypes changed
                self._cat = False
        return total_norm(torch, grads)


def _cat_fits(grads: list[Any]) -> bool:
    # Few small float32 tensors on one device: one cat and one norm beat the foreach
    # kernels' fixed cost (the cat copies every gradient, hence "small").
    if not grads or len(grads) > _FEW:
        return False
    first = grads[0]
    same = all(g.device == first.device and g.dtype == first.dtype for g in grads)
    contiguous = all(g.is_contiguous() and not g.is_sparse for g in grads)
    small = sum(g.numel() for g in grads) <= _SMALL
    return same and contiguous and small and str(first.dtype) == "torch.float32"


def total_norm(torch: Any, grads: list[Any], dtype: Any = None) -> Any:
    """The L2 norm of all gradients as a 0-dim tensor (on the gradients' device), or None.

    `dtype=torch.float64` computes it without float32 overflow (used only when the fast
    float32 norm came out infinite)."""
    if not grads:
        return None
    by_device: dict[Any, list[Any]] = {}
    for g in grads:
        if g.is_sparse:
            g = g.coalesce()._values()
        by_device.setdefault(g.device, []).append(g if dtype is None else g.to(dtype))
    parts = []
    for gs in by_device.values():
        norms = (
            torch._foreach_norm(gs) if hasattr(torch, "_foreach_norm") else [g.norm() for g in gs]
        )
        stacked = torch.stack([n.float() if dtype is None else n for n in norms])
        parts.append(torch.linalg.vector_norm(stacked))
    if len(parts) == 1:
        return parts[0]
    device = parts[0].device
    return torch.linalg.vector_norm(torch.stack([p.to(device, non_blocking=True) for p in parts]))


def norm_tensor(torch: Any, tensors: list[Any]) -> Any:
    """Per-tensor L2 norms as one float32 tensor on the first tensor's device (no read-back)."""
    if not tensors:
        return None
    tensors = local_all(tensors)
    device = tensors[0].device
    values = torch._foreach_norm([t.detach() for t in tensors])
    return torch.stack([v.float().to(device, non_blocking=True) for v in values])
