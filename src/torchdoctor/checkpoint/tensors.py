"""The tensors of a state dict found in a checkpoint, as real CPU tensors.

A file that torch's weights_only loader accepts is loaded by it (memory-mapped for the zip
format, so only what is used is read). A file that needs code (a whole pickled nn.Module) is
not unpickled at all: the tensors described by `reader` are rebuilt from the raw bytes of their
storages in the zip (or a safetensors file), so weights can be rescued from a model whose class
is gone without running the file's code.
"""

from __future__ import annotations

import json
import struct
import zipfile
from typing import Any

from torchdoctor.checkpoint.reader import Checkpoint, CheckpointError, TensorRef
from torchdoctor.checkpoint.summary import StateDict


def load(ckpt: Checkpoint, sd: StateDict, weights_only_ok: bool) -> dict[str, Any]:
    """{key: torch.Tensor} for the state dict `sd` of `ckpt`."""
    if ckpt.format == "safetensors":
        return _from_safetensors(ckpt, sd)
    if weights_only_ok and not sd.from_module:
        return _from_torch_load(ckpt, sd)
    if ckpt.format == "zip":
        return _from_zip(ckpt, sd)
    raise CheckpointError(
        "this legacy-format file needs code to load; torchdoctor rebuilds tensors without "
        "running code only from zip (torch.save since 1.6) and safetensors files"
    )


def _from_torch_load(ckpt: Checkpoint, sd: StateDict) -> dict[str, Any]:
    import torch

    obj: Any = torch.load(
        ckpt.path, map_location="cpu", weights_only=True, mmap=ckpt.format == "zip"
    )
    for part in sd.parts:
        obj = obj[int(part)] if isinstance(obj, (list, tuple)) else obj[part]
    return {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"cannot rebuild tensors of dtype {name}")
    return dtype


def _from_zip(ckpt: Checkpoint, sd: StateDict) -> dict[str, Any]:
    import torch

    if ckpt.metadata.get("byteorder", "little") != "little":
        raise CheckpointError("a big-endian checkpoint: rebuild it with torch.load instead")
    prefix = ckpt.metadata["archive"]
    raw: dict[str, bytearray] = {}
    out: dict[str, Any] = {}
    with zipfile.ZipFile(ckpt.path) as archive:
        for key, ref in sd.tensors.items():
            if ref.storage is None:
                raise CheckpointError(f"{key}: a tensor without storage cannot be rebuilt")
            skey = ref.storage.key
            if skey not in raw:
                raw[skey] = bytearray(archive.read(f"{prefix}/data/{skey}"))
            out[key] = _view(torch, raw[skey], ref)
    return out


def _view(torch: Any, data: bytearray, ref: TensorRef) -> Any:
    storage_dtype = _dtype(ref.storage.dtype if ref.storage else ref.dtype)
    flat = (
        torch.frombuffer(data, dtype=storage_dtype) if data else torch.empty(0, dtype=storage_dtype)
    )
    if ref.dtype != (ref.storage.dtype if ref.storage else ref.dtype):
        flat = flat.view(_dtype(ref.dtype))
    stride = ref.stride or _contiguous(ref.shape)
    return flat.as_strided(ref.shape, stride, ref.offset).clone()


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= max(d, 1)
    return tuple(reversed(out))


def _from_safetensors(ckpt: Checkpoint, sd: StateDict) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    with open(ckpt.path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for key, ref in sd.tensors.items():
            start, stop = header[key]["data_offsets"]
            f.seek(base + start)
            data = bytearray(f.read(stop - start))
            flat = torch.frombuffer(data, dtype=_dtype(ref.dtype)) if data else torch.empty(0)
            out[key] = flat.reshape(ref.shape).clone()
    return out
