"""save_image writes the normalised grid's bytes (not a PNG: no PIL here), deterministically,
so that files written by a plain run and a run under torchdoctor can be compared."""

from __future__ import annotations

from typing import Any

import torch


def make_grid(
    tensor: torch.Tensor, nrow: int = 8, padding: int = 2, normalize: bool = False, **_: Any
) -> torch.Tensor:
    t = tensor.detach().float()
    if normalize:
        t = (t - t.min()) / (t.max() - t.min() + 1e-5)
    return t


def save_image(
    tensor: torch.Tensor,
    fp: Any,
    nrow: int = 8,
    padding: int = 2,
    normalize: bool = False,
    **kwargs: Any,
) -> None:
    grid = make_grid(tensor, nrow=nrow, padding=padding, normalize=normalize, **kwargs)
    data = (grid.clamp(0, 1) * 255).to(torch.uint8).cpu().numpy().tobytes()
    if hasattr(fp, "write"):
        fp.write(data)
    else:
        with open(fp, "wb") as fh:
            fh.write(data)
