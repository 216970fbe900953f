"""`--fix OUT`: the state dict that loads into the model with strict=True.

Keys are renamed by the remap `keys.compare` found; checkpoint keys the model lacks are dropped;
model keys the checkpoint cannot fill (missing, or of another shape: a head with another number
of classes) keep the model's own initial values, and the report names each. A checkpoint that
would fill less than half of the model is refused: it belongs to another model. The file is
written with torch.save (or as safetensors when OUT ends in .safetensors and the package is
installed), read back with weights_only=True and loaded into the model with strict=True.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchdoctor.checkpoint.keys import Comparison, Remap

MIN_FILLED = 0.5  # share of the model's elements that must come from the checkpoint


class FixError(Exception):
    pass


def build(
    comparison: Comparison, tensors: dict[str, Any], model_state: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fixed state dict, in the model's key order, and what was done."""
    renamed: dict[str, str] = {}
    for key in tensors:
        renamed.setdefault(comparison.remap(key), key)
    fixed: dict[str, Any] = {}
    from_model: list[str] = []
    filled = total = 0
    matched = set(comparison.matched)
    for key, own in model_state.items():
        total += own.numel()
        if key in matched:
            fixed[key] = tensors[renamed[key]]
            filled += own.numel()
        else:
            fixed[key] = own.detach().clone()
            from_model.append(key)
    share = filled / total if total else 1.0
    if share < MIN_FILLED:
        raise FixError(
            f"the checkpoint fills only {share:.0%} of the model's weights "
            f"({len(matched)} of {len(model_state)} tensors): it belongs to another model, "
            "so no fixed file was written"
        )
    report = {
        "renamed": sum(1 for k in comparison.matched if renamed[k] != k),
        "from_checkpoint": len(matched),
        "from_model": from_model,
        "dropped": list(comparison.unexpected),
        "filled_share": share,
    }
    return fixed, report


def extract(tensors: dict[str, Any], remap: Remap) -> dict[str, Any]:
    """Without a model: the state dict alone, wrapper prefixes removed."""
    return {remap(k): v for k, v in tensors.items()}


def save(state: dict[str, Any], out: Path) -> None:
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    state = {k: v.detach().contiguous() for k, v in state.items()}
    if out.suffix == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise FixError(
                "writing .safetensors needs the safetensors package "
                "(pip install 'torchdoctor[safetensors]'), or give OUT another extension"
            ) from None
        save_file(state, str(tmp))
    else:
        torch.save(state, tmp)
    tmp.replace(out)


def verify(model: Any, out: Path) -> str | None:
    """None when OUT loads into `model` with strict=True, else the error."""
    import torch

    try:
        if out.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(out))
        else:
            state = torch.load(out, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
