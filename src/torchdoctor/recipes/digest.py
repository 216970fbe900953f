"""A tensor's exact contents as a short string, computed where the tensor lives (no copy to the
host): its bytes summed plain and weighted by position, in int64. Equal tensors give equal
digests; a tensor that differs in one bit gives another. The repro mode compares two runs with
these."""

from __future__ import annotations

from typing import Any

TENSORS_PER_VALUE = 4


def tensor_digest(torch: Any, t: Any) -> str | None:
    try:
        if t.is_sparse or t.is_quantized or t.is_meta:
            return None
        flat = t.detach().contiguous().reshape(-1)
        if flat.numel() == 0:
            return f"{t.dtype}{list(t.shape)}"
        raw = flat.view(torch.uint8).to(torch.int64)
        weights = torch.arange(1, raw.numel() + 1, device=raw.device, dtype=torch.int64)
        plain, weighted = torch.stack([raw.sum(), (raw * weights).sum()]).tolist()
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}:{plain}:{weighted}"
    except Exception:
        return None


def value_digest(torch: Any, value: Any) -> str | None:
    """The digests of the (first few) tensors in an op's or a module's output."""
    found: list[Any] = []
    _tensors(torch, value, found, 0)
    if not found:
        return None
    return "|".join(str(tensor_digest(torch, t)) for t in found)


def _tensors(torch: Any, value: Any, out: list[Any], depth: int) -> None:
    if len(out) >= TENSORS_PER_VALUE or depth > 3:
        return
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors(torch, item, out, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(torch, item, out, depth + 1)
