"""`torchdoctor ckpt` as data: read the file, compare it with a model, write the fix.

`examine` returns one CheckpointReport (checkpoint/examined.py: its JSON is `--format json`;
report.checkpoint renders it) with its `status`: "ok" (readable, and loads strictly into the
model when one is given), "needs_code" (torch's weights_only loader refuses the file),
"mismatch" (the keys do not fit the model), "fixed" (--fix wrote a file that loads strictly),
"not_fixed", "no_state_dict" (--model or --fix given, and the file holds no dict of
tensors).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torchdoctor.checkpoint import factory, fix, keys, reader, summary, tensors
from torchdoctor.checkpoint.examined import (
    CheckpointReport,
    Extracted,
    Fix,
    FixedForModel,
    FixFailed,
    Head,
    KeyCounts,
    ModelReport,
    ShapeMismatch,
)


def _choose(
    found: list[summary.StateDict], model_shapes: dict[str, Any], wanted: str | None
) -> tuple[summary.StateDict, keys.Comparison]:
    """The state dict meant for the model: the one named by --key, else the best fit."""
    if wanted is not None:
        for sd in found:
            if sd.path == wanted:
                return sd, keys.compare(sd.shapes(), model_shapes)
        paths = ", ".join(repr(sd.path) for sd in found) or "none"
        raise factory.FactoryError(f"--key {wanted!r}: no state dict there (found: {paths})")
    best: tuple[summary.StateDict, keys.Comparison] | None = None
    for sd in found:
        comparison = keys.compare(sd.shapes(), model_shapes)
        if best is None or len(comparison.matched) > len(best[1].matched):
            best = (sd, comparison)
    assert best is not None
    return best


def _remedy_code(sd: summary.StateDict, comparison: keys.Comparison, path: str) -> str:
    """The same repair in the user's own code."""
    remap = comparison.remap
    index = "".join(f"[{p}]" if p.isdigit() else f"[{p!r}]" for p in sd.parts)
    lines = [f'sd = torch.load("{path}", map_location="cpu", weights_only=True){index}']
    expr = "k"
    if remap.drop:
        expr = f'".".join(p for p in k.split(".") if p not in {tuple(remap.drop)!r})'
    if remap.strip:
        expr = (
            f"{expr}.removeprefix({remap.strip!r})"
            if expr == "k"
            else f"({expr}).removeprefix({remap.strip!r})"
        )
    if remap.add:
        expr = f"{remap.add!r} + {expr}"
    if expr != "k":
        lines.append(f"sd = {{{expr}: v for k, v in sd.items()}}")
    left_out = sorted(
        {m["key"] for m in comparison.mismatched} | {remap(k) for k in comparison.unexpected}
    )
    if left_out:
        shown = repr(set(left_out)) if len(left_out) <= 6 else "{...}  # " + f"{len(left_out)} keys"
        lines.append(f"sd = {{k: v for k, v in sd.items() if k not in {shown}}}")
    if left_out or comparison.missing:
        lines.append("# the model's keys not in sd keep their initial values")
        lines.append("model.load_state_dict(sd, strict=False)")
    else:
        lines.append("model.load_state_dict(sd, strict=True)")
    return "\n".join(lines)


def examine(
    path: str,
    model_spec: str | None = None,
    fix_out: str | None = None,
    key: str | None = None,
) -> CheckpointReport:
    """Everything `torchdoctor ckpt` says about `path`. Raises OSError for a file that cannot
    be opened, reader.CheckpointError for one that is not a readable checkpoint, and
    factory.FactoryError when --model does not give a model."""
    ckpt = reader.read(path)
    out = summary.summarize(ckpt)
    status = "ok" if out.loads_weights_only else "needs_code"
    found = summary.state_dicts(ckpt)
    if model_spec is None and fix_out is None:
        return dataclasses.replace(out, status=status)
    if not found:
        return dataclasses.replace(
            out,
            problem="the checkpoint holds no state dict (no dict of tensors, no module)",
            status=status if status == "needs_code" else "no_state_dict",
        )
    if model_spec is None:
        sd = next((s for s in found if s.path == key), found[0]) if key else found[0]
        remap = keys.find_remap(sd.shapes(), {_unwrapped(k): () for k in sd.tensors})
        extracted = _write_extracted(ckpt, sd, remap, Path(fix_out or ""), out)
        return dataclasses.replace(
            out, fix=extracted, status="fixed" if extracted.written else "not_fixed"
        )
    model = factory.load(model_spec)
    model_state = model.state_dict()
    model_shapes = {k: tuple(v.shape) for k, v in model_state.items()}
    sd, comparison = _choose(found, model_shapes, key)
    report = ModelReport(
        loads_strictly=comparison.loads_strictly,
        fixable_by_renaming=comparison.fixable,
        remap=comparison.remap,
        remap_steps=comparison.remap.describe(),
        renamed=comparison.renamed,
        matched=len(comparison.matched),
        missing=comparison.missing,
        unexpected=comparison.unexpected,
        mismatched=[
            ShapeMismatch(m["key"], m["checkpoint"], m["model"], m["from"])
            for m in comparison.mismatched
        ],
        heads=[Head(**h) for h in comparison.heads],
        before_remap=KeyCounts(**comparison.before),
        causes=comparison.causes(),
        factory=model_spec,
        model_type=type(model).__name__,
        model_tensors=len(model_state),
        state_dict=sd.path,
        state_dict_tensors=len(sd.tensors),
        code=None if comparison.loads_strictly else _remedy_code(sd, comparison, path),
    )
    if comparison.loads_strictly:
        status = "ok" if status == "ok" else status
    elif status == "ok":
        status = "mismatch"
    fixed: Fix | None = None
    if fix_out is not None:
        fixed = _write_fixed(ckpt, sd, comparison, model, model_state, Path(fix_out), out)
        status = "fixed" if fixed.loads_strictly else "not_fixed"
    return dataclasses.replace(out, model=report, fix=fixed, status=status)


def _unwrapped(key: str) -> str:
    return ".".join(p for p in key.split(".") if p not in keys.WRAPPERS)


def _tensors(ckpt: reader.Checkpoint, sd: summary.StateDict, info: CheckpointReport) -> Any:
    return tensors.load(ckpt, sd, info.loads_weights_only)


def _write_fixed(
    ckpt: reader.Checkpoint,
    sd: summary.StateDict,
    comparison: keys.Comparison,
    model: Any,
    model_state: dict[str, Any],
    out_path: Path,
    info: CheckpointReport,
) -> FixFailed | FixedForModel:
    try:
        values = _tensors(ckpt, sd, info)
        fixed, done = fix.build(comparison, values, model_state)
        fix.save(fixed, out_path)
    except (fix.FixError, reader.CheckpointError) as exc:
        return FixFailed(out=str(out_path), written=False, loads_strictly=False, error=str(exc))
    error = fix.verify(model, out_path)
    return FixedForModel(
        out=str(out_path),
        written=True,
        loads_strictly=error is None,
        **done,
        load_error=error,
    )


def _write_extracted(
    ckpt: reader.Checkpoint,
    sd: summary.StateDict,
    remap: keys.Remap,
    out_path: Path,
    info: CheckpointReport,
) -> FixFailed | Extracted:
    try:
        values = _tensors(ckpt, sd, info)
        fix.save(fix.extract(values, remap), out_path)
    except (fix.FixError, reader.CheckpointError) as exc:
        return FixFailed(out=str(out_path), written=False, loads_strictly=None, error=str(exc))
    return Extracted(
        out=str(out_path),
        written=True,
        loads_strictly=None,
        state_dict=sd.path,
        tensors=len(values),
        remap=remap,
        remap_steps=remap.describe(),
    )
