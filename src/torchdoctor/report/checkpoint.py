"""`torchdoctor ckpt` as text: the file, its contents, the comparison with a model, the fix."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from torchdoctor._json import dumps
from torchdoctor.checkpoint.examined import (
    CheckpointReport,
    Extracted,
    Fix,
    FixedForModel,
    GroupCount,
    ModelReport,
    Node,
)
from torchdoctor.units import human

WIDTH = 100
MAX_KEYS_SHOWN = 8
TREE_DEPTH = 3  # levels of the contents shown as text (--format json has them all)
TREE_CHILDREN = 12


def _wrap(text: str, first: str, rest: str | None = None) -> str:
    return textwrap.fill(
        text,
        width=WIDTH,
        initial_indent=first,
        subsequent_indent=rest if rest is not None else " " * len(first),
        break_long_words=False,
        break_on_hyphens=False,
    )


_FORMATS = {
    "zip": "torch.save (zip format)",
    "legacy": "torch.save (legacy format of torch < 1.6)",
    "safetensors": "safetensors",
}


def _by(groups: dict[str, GroupCount]) -> str:
    return ", ".join(
        f"{name} ({g.tensors} tensor{'s' * (g.tensors != 1)}, {human(g.bytes)})"
        for name, g in groups.items()
    )


def _describe(node: Node) -> str:
    kind = node.type
    if node.kind == "value":
        return f"{kind} {node.value!r}" if kind not in ("type",) else str(node.value)
    if node.kind == "tensor":
        shape = "x".join(str(d) for d in node.shape or []) or "scalar"
        return f"{kind} {node.dtype} {shape} on {node.device}"
    said = f"{kind}[{node.len}]"
    kids = node.children
    if kids and len(kids) <= 6 and all(k.kind == "value" for k in kids) and not node.more:
        values = ", ".join(repr(k.value) for k in kids)
        return f"{kind} ({values})" if kind == "tuple" else f"{kind} [{values}]"
    if node.state_dict:
        said += " state dict"
    if node.tensors:
        said += f": {node.tensors} tensors, {human(node.bytes)}"
    return said


def _inline(node: Node) -> bool:
    kids = node.children
    return bool(kids) and len(kids) <= 6 and all(k.kind == "value" for k in kids)


def _tree(node: Node, depth: int, out: list[str]) -> None:
    kids = node.children
    for child in kids[:TREE_CHILDREN]:
        name = child.name or "(top)"
        out.append(f"  {'  ' * depth}{name:<{max(1, 24 - 2 * depth)}} {_describe(child)}")
        if depth + 1 < TREE_DEPTH and not _inline(child):
            _tree(child, depth + 1, out)
    more = len(kids) - TREE_CHILDREN + node.more
    if more > 0:
        out.append(f"  {'  ' * depth}... {more} more")


def _keys(title: str, items: Sequence[str]) -> list[str]:
    if not items:
        return []
    shown = ", ".join(items[:MAX_KEYS_SHOWN])
    more = f", ... (+{len(items) - MAX_KEYS_SHOWN})" if len(items) > MAX_KEYS_SHOWN else ""
    return [_wrap(f"{shown}{more}", f"  {title} ({len(items)}): ", "      ")]


def render_text(data: CheckpointReport) -> str:
    out: list[str] = []
    fmt = _FORMATS.get(data.format, data.format)
    out.append(f"{data.file}: {fmt}, {human(data.file_bytes)} on disk")
    if data.loads_weights_only:
        out.append("  loads with torch.load(weights_only=True): yes (no code runs)")
    else:
        out.append("  loads with torch.load(weights_only=True): NO: the file needs code to load")
        groups: dict[str, list[str]] = {}
        for item in data.needs_code:
            groups.setdefault(item.why, []).append(item.name)
        for why, names in groups.items():
            out.append(_wrap(f"{why}: {', '.join(names)}", "    - ", "      "))
        if data.torch_says:
            out.append(_wrap(f"torch says: {data.torch_says}", "    "))
        out.append(
            _wrap(
                "torchdoctor does not run code from a checkpoint. If you trust the file, load "
                "it with weights_only=False where its classes can be imported and re-save "
                "model.state_dict(); with --model (and --fix) torchdoctor reads the weights "
                "without running it.",
                "    ",
            )
        )
    count = f"{data.tensors} tensor{'s' * (data.tensors != 1)}"
    out.append(f"  {count}, {human(data.bytes)}: {_by(data.dtypes) or 'none'}")
    root = data.structure
    if root.kind != "container" or (not root.children and not root.state_dict):
        out.append(f"  the file holds one {_describe(root)}")
    if data.devices:
        out.append(_wrap(f"saved from: {_by(data.devices)}", "  ", "    "))
        if any(d.startswith(("cuda", "mps", "xpu")) for d in data.devices):
            out.append(
                "    (on a machine without that device: torch.load(..., map_location='cpu'))"
            )
    for sd in data.state_dicts[:4]:
        where = f"checkpoint{_index(sd.path)}" if sd.path else "the top level"
        what = "rebuilt from a pickled nn.Module" if sd.from_module_object else "a dict"
        out.append(f"  state dict at {where}: {sd.tensors} tensors, {human(sd.bytes)} ({what})")
    tree: list[str] = []
    _tree(data.structure, 0, tree)
    if tree:
        out += ["", "Contents", *tree]
    if data.problem:
        out += ["", _wrap(f"--model/--fix: {data.problem}", "")]
    if data.model is not None:
        out += ["", *_model(data.model)]
    if data.fix is not None:
        out += ["", *_fix(data.fix)]
    return "\n".join(out)


def _index(path: str) -> str:
    return "".join(f"[{p}]" if p.isdigit() else f"[{p!r}]" for p in path.split("."))


def _model(m: ModelReport) -> list[str]:
    where = f"checkpoint{_index(m.state_dict)}" if m.state_dict else "the checkpoint"
    out = [
        f"Against {m.factory} ({m.model_type}, {m.model_tensors} tensors), "
        f"reading {where} ({m.state_dict_tensors} tensors)"
    ]
    if m.loads_strictly:
        out.append("  loads with strict=True: yes")
        return out
    before = m.before_remap
    out.append(
        f"  loads with strict=True: NO (as saved: {before.matched} keys match, "
        f"{before.missing} missing, {before.unexpected} unexpected)"
    )
    if m.renamed:
        out.append(
            f"  after renaming {m.renamed} keys: {m.matched} match, "
            f"{len(m.missing)} missing, {len(m.unexpected)} unexpected, "
            f"{len(m.mismatched)} of another shape"
        )
    out += _keys("missing", m.missing)
    out += _keys("unexpected", m.unexpected)
    shapes = [
        f"{x.key} (checkpoint {_shape(x.checkpoint)}, model {_shape(x.model)})"
        for x in m.mismatched
    ]
    out += _keys("other shape", shapes)
    if m.causes:
        out.append("  Why")
        out += [_wrap(c, "    - ", "      ") for c in m.causes]
    if m.fixable_by_renaming:
        out.append("  Renaming fixes it; in your code:")
    else:
        out.append("  Renaming alone does not fix it; the renaming part, in your code:")
    out += [f"    {line}" for line in (m.code or "").splitlines()]
    out.append("  or let torchdoctor write the fixed state dict: --fix OUT.pt")
    return out


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _fix(f: Fix) -> list[str]:
    if not f.written or not isinstance(f, (Extracted, FixedForModel)):
        error = getattr(f, "error", None)
        return [_wrap(f"Fix: not written: {error}", "", "  ")]
    out = [f"Fix written to {f.out}"]
    if isinstance(f, Extracted):
        out.append(
            f"  the state dict at {f.state_dict or 'the top level'} alone, {f.tensors} tensors"
        )
        out += [_wrap(s, "  - ", "    ") for s in f.remap_steps]
        return out
    out.append(
        f"  {f.from_checkpoint} tensors from the checkpoint ({f.renamed} renamed), "
        f"{f.filled_share:.0%} of the model's weights"
    )
    out += _keys("dropped (not in the model)", f.dropped)
    out += _keys("NOT fixed, left at the model's own initial values", f.from_model)
    if f.loads_strictly:
        out.append("  loads with strict=True: yes")
    else:
        out.append(_wrap(f"loads with strict=True: NO: {f.load_error}", "  "))
    return out


def render_json(data: CheckpointReport) -> str:
    return dumps(data, indent=2)


def render_error(path: str, kind: str, message: str, fmt: str) -> str:
    """A file that is not a readable checkpoint."""
    if fmt == "json":
        return dumps({"file": path, "status": kind, "error": message}, indent=2)
    return f"{path}: {message}"
