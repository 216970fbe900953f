"""A tensor's exact contents as a short string: a BLAKE2 hash of its bytes, read in place on the
host (a CUDA tensor is copied to the host first). Equal tensors give equal digests; a tensor
that differs in one bit gives another. The repro mode compares two runs with these."""

from __future__ import annotations

import hashlib
from typing import Any

TENSORS_PER_VALUE = 4


def tensor_digest(torch: Any, t: Any) -> str | None:
    try:
        if t.is_sparse or t.is_quantized or t.is_meta:
            return None
        flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
        kind = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
        if flat.numel() == 0:
            return kind
        raw = flat.view(torch.uint8).cpu().numpy()  # no copy for a CPU tensor
        return f"{kind}:{hashlib.blake2b(raw.data, digest_size=12).hexdigest()}"
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
