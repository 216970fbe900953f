"""Gradient norms: the total one every step (also the finiteness check), per module on traced
steps. On CUDA everything stays on the device; the values are read back later."""

from __future__ import annotations

from typing import Any


def collect(optimizer: Any) -> tuple[list[Any], list[Any]]:
    """(params with a gradient, their gradients) over the optimizer's groups."""
    params, grads = [], []
    for group in optimizer.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is not None:
                params.append(p)
                grads.append(g)
    return params, grads


_FEW = 32
_SMALL = 1 << 20


def all_finite(torch: Any, grads: list[Any]) -> bool:
    return all(bool(torch.isfinite(g).all()) for g in grads)


def total_norm(torch: Any, grads: list[Any], dtype: Any = None) -> Any:
    """The L2 norm of all gradients as a 0-dim tensor (on the gradients' device), or None.

    `dtype=torch.float64` computes it without float32 overflow (used only when the fast
    float32 norm came out infinite)."""
    if not grads:
        return None
    if dtype is None and len(grads) <= _FEW:
        # Few tensors: one cat and one norm beat the foreach kernels' fixed cost. Only when
        # small, since the cat copies every gradient.
        first = grads[0]
        same = all(g.device == first.device and g.dtype == first.dtype for g in grads)
        if same and not first.is_sparse and sum(g.numel() for g in grads) <= _SMALL:
            return torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]).float())
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


def norms(torch: Any, tensors: list[Any]) -> list[float]:
    """Per-tensor L2 norms as floats (one device read; used on traced steps only)."""
    if not tensors:
        return []
    values = torch._foreach_norm([t.detach() for t in tensors])
    return [float(v) for v in torch.stack([v.float() for v in values]).cpu().tolist()]
