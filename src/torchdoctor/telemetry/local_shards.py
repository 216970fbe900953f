"""This rank's own data of a DTensor (FSDP2's sharded parameters and gradients, tensor-parallel
weights), and nothing more.

An op on a DTensor runs DTensor's dispatch, which redistributes as it needs: a norm of a
sharded gradient, then `float()` of it, all-gathers or all-reduces across the mesh. A probe
that issues collectives of its own desynchronises a job the moment ranks sample differently,
so every value torchdoctor computes from a tensor that may be a DTensor is computed on
`local(tensor)`: plain tensors pass through untouched (one class check), DTensors give their
local shard. A job-wide value (the global gradient norm) is combined from what the ranks
publish, never by a collective (docs/distributed.md).
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor.sharding import dtensor_class as _dtensor_class

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the classes that need no look at all


def is_dtensor(t: Any) -> bool:
    if t.__class__ in PLAIN:
        return False
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


def local(t: Any) -> Any:
    """`t`'s data on this rank: itself for a plain tensor, the local shard of a DTensor
    (detached: no autograd node, no communication)."""
    if t.__class__ in PLAIN:
        return t
    cls = _dtensor_class()
    if cls is None or not isinstance(t, cls):
        return t
    with torch.no_grad():
        return t.to_local()


def local_all(tensors: list[Any]) -> list[Any]:
    cls = None
    out = tensors
    for i, t in enumerate(tensors):
        if t.__class__ in PLAIN:
            continue
        cls = cls or _dtensor_class()
        if cls is None:
            return tensors
        if isinstance(t, cls):
            if out is tensors:
                out = list(tensors)
            with torch.no_grad():
                out[i] = t.to_local()
    return out


def largest_values(params: list[Any]) -> list[float]:
    """The largest absolute value of each floating-point parameter's shard on this rank (NaN
    or Inf where it holds one): one reduction and one read per device and dtype, never a
    DTensor's own max (a collective)."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault((p.device, p.dtype), []).append(i)
    out = [0.0] * len(params)
    with torch.no_grad():
        for indices in groups.values():
            shards = [local(params[i].detach()) for i in indices]
            tops = torch.stack(torch._foreach_norm(shards, ord=float("inf"))).tolist()
            for i, top in zip(indices, tops, strict=True):
                out[i] = top
    return out


def has_sharded_state(module: Any) -> bool:
    """The module (or a submodule) holds DTensor parameters or is managed by FSDP: running its
    forward would all-gather across the mesh."""
    cls = _dtensor_class()
    for sub in module.modules():
        name = type(sub).__name__
        if name.startswith("FSDP") or name == "FullyShardedDataParallel":
            return True
        if cls is not None:
            for p in sub.parameters(recurse=False):
                if isinstance(p, cls):
                    return True
    return False
